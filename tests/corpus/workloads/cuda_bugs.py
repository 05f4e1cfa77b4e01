"""Two GPU failures for the explain corpus (tests/corpus/make_explain_corpus.py --cuda):
a real CUDA out-of-memory and a kernel's device-side assert.

    python cuda_bugs.py --bug cuda-oom | cuda-device-assert
"""

import argparse

import torch


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--bug", choices=("cuda-oom", "cuda-device-assert"), required=True)
    bug = parser.parse_args().bug
    print(f"start bug={bug} torch={torch.__version__} gpu={torch.cuda.get_device_name()}", flush=True)
    if bug == "cuda-oom":
        model = torch.nn.Linear(4096, 4096).cuda()
        _, total = torch.cuda.mem_get_info()
        batch = int(total * 1.5) // (4096 * 4)           # activations for half again the card
        print(model(torch.randn(batch, 4096, device="cuda")).sum().item())
    else:
        embedding = torch.nn.Embedding(100, 16).cuda()
        ids = torch.randint(0, 120, (8, 32), device="cuda")   # ids past the vocabulary
        print(embedding(ids).sum().item())


if __name__ == "__main__":
    main()
