"""Plain bugs in a process that runs several threads, none a race: the explain corpus's trap
for a shared-state analysis (tests/corpus/make_explain_corpus.py). Three worker threads read
a module-level config that the main thread filled once at start-up (a process-wide dict,
written at run time) and all three fail on the same missing key.

    python thread_bugs.py
"""

import threading

import torch

CONFIG: dict = {}


def load_config() -> None:
    CONFIG.update({"lr": 3e-4, "weight_decay": 0.01})


def train_worker(index: int) -> None:
    torch.manual_seed(index)
    model = torch.nn.Linear(16, 4)
    optimizer = torch.optim.AdamW(model.parameters(), lr=CONFIG["lr"], betas=CONFIG["betas"])
    for step in range(1, 4):
        loss = model(torch.randn(8, 16)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        print(f"worker={index} step={step} loss={loss.item():.4f}", flush=True)


def main() -> None:
    load_config()
    threads = [threading.Thread(target=train_worker, args=(i,), name=f"worker-{i}") for i in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


if __name__ == "__main__":
    main()
