"""Ordinary single-threaded training bugs, each as a small torch training script would make
it: one of the explain corpus's families (tests/corpus/make_explain_corpus.py).

    python single_bugs.py --bug NAME

Every bug is the library's own failure (torch, the standard library): nothing here prints a
traceback by hand or raises an exception a library would not.
"""

import argparse
import json
import os

import torch

BUGS = ("config-keyerror", "shape-mismatch", "cpu-oom", "file-not-found", "dtype-mismatch",
        "target-out-of-range", "anomaly-nan", "backward-twice", "inplace-autograd",
        "dataloader-worker", "fullgraph-graph-break")


def load_config(path: str) -> dict:
    with open(path) as handle:
        return json.load(handle)


def build_optimizer(model, config: dict):
    settings = config["optimizer"]
    return torch.optim.AdamW(model.parameters(), lr=settings["lr"], betas=settings["betas"])


def model_and_data(features=32):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(features, 64), torch.nn.ReLU(),
                                torch.nn.Linear(64, 8))
    inputs = torch.randn(256, features)
    labels = torch.randint(0, 8, (256,))
    return model, inputs, labels


def train(model, inputs, labels, optimizer, steps=5, batch=16):
    for step in range(1, steps + 1):
        index = torch.randint(0, inputs.shape[0], (batch,))
        loss = torch.nn.functional.cross_entropy(model(inputs[index]), labels[index])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        print(f"step={step} loss={loss.item():.4f}", flush=True)


class Tokens(torch.utils.data.Dataset):
    """Examples keyed by the field names a tokenizer would give; one is missing a field."""

    def __init__(self):
        self.rows = [{"input_ids": [i, i + 1], "labels": [i + 1, i + 2]} for i in range(64)]
        del self.rows[37]["labels"]

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, index):
        row = self.rows[index]
        return torch.tensor(row["input_ids"]), torch.tensor(row["labels"])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--bug", choices=BUGS, required=True)
    parser.add_argument("--workdir", default=".")
    bug = parser.parse_args().bug
    workdir = parser.parse_args().workdir
    model, inputs, labels = model_and_data()
    print(f"start bug={bug} torch={torch.__version__}", flush=True)
    if bug == "config-keyerror":
        path = os.path.join(workdir, "run_config.json")
        with open(path, "w") as handle:
            json.dump({"optimizer": {"lr": 3e-4, "weight_decay": 0.01}, "steps": 5}, handle)
        train(model, inputs, labels, build_optimizer(model, load_config(path)))
    elif bug == "shape-mismatch":
        model, _, _ = model_and_data(features=32)
        train(model, torch.randn(256, 31), labels, torch.optim.SGD(model.parameters(), lr=0.1))
    elif bug == "cpu-oom":
        train(model, inputs, labels, torch.optim.SGD(model.parameters(), lr=0.1), steps=2)
        activations = torch.empty(1 << 22, 1 << 22)          # 64 TiB of float32
        print(activations.shape)
    elif bug == "file-not-found":
        model.load_state_dict(torch.load(os.path.join(workdir, "checkpoints", "step-1000.pt")))
    elif bug == "dtype-mismatch":
        train(model, inputs.double(), labels, torch.optim.SGD(model.parameters(), lr=0.1))
    elif bug == "target-out-of-range":
        train(model, inputs, labels + 4, torch.optim.SGD(model.parameters(), lr=0.1))
    elif bug == "anomaly-nan":
        with torch.autograd.detect_anomaly():
            out = model(inputs[:16])
            loss = torch.sqrt(out - out.max() - 1).mean()    # the square root of a negative number: nan
            loss.backward()
    elif bug == "backward-twice":
        loss = torch.nn.functional.cross_entropy(model(inputs[:16]), labels[:16])
        loss.backward()
        (loss * 2).backward()
    elif bug == "inplace-autograd":
        hidden = torch.sigmoid(model[0](inputs[:16]))
        hidden += 1                                           # sigmoid's output, needed by its backward
        hidden.sum().backward()
    elif bug == "dataloader-worker":
        loader = torch.utils.data.DataLoader(Tokens(), batch_size=8, num_workers=2)
        for step, (ids, targets) in enumerate(loader, 1):
            print(f"step={step} batch={tuple(ids.shape)}", flush=True)
    elif bug == "fullgraph-graph-break":
        @torch.compile(fullgraph=True, backend="eager")
        def scaled(x):
            if x.sum() > 0:                                   # data-dependent control flow
                return x * 2
            return x
        print(scaled(inputs).shape)


if __name__ == "__main__":
    main()
