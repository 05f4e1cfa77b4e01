"""Hugging Face Trainer runs that fail as users' runs do: the explain corpus's Trainer family
(tests/corpus/make_explain_corpus.py). A 2-layer GPT-2 built from GPT2Config, synthetic
tokens, CPU, nothing downloaded.

    python hf_bugs.py --bug NAME [--output-dir DIR]
    torchrun --nproc-per-node 2 hf_bugs.py --bug rank1-collator    (DDP over gloo)
"""

import argparse
import os

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

BUGS = ("no-labels", "removed-argument", "import-error", "rank1-collator", "seq-too-long")


class SyntheticTokens(torch.utils.data.Dataset):
    def __init__(self, count: int, length: int, vocab: int, labels: bool = True):
        generator = torch.Generator().manual_seed(0)
        self.rows = torch.randint(0, vocab, (count, length), generator=generator)
        self.labels = labels

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> dict:
        row = {"input_ids": self.rows[index]}
        if self.labels:
            row["labels"] = self.rows[index]
        return row


def collate(rows: list) -> dict:
    """Stacks the rows; on rank 1 the third batch lost its labels (a bad shard)."""
    rank = int(os.environ.get("RANK", "0"))
    collate.calls = getattr(collate, "calls", 0) + 1
    if rank == 1 and collate.calls == 3:
        rows = [{"input_ids": r["input_ids"]} for r in rows]
    return {"input_ids": torch.stack([r["input_ids"] for r in rows]),
            "labels": torch.stack([r["labels"] for r in rows])}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--bug", choices=BUGS, required=True)
    parser.add_argument("--output-dir", default="out")
    args = parser.parse_args()
    torch.manual_seed(0)
    if args.bug == "import-error":
        from transformers import GPT2FlashModel  # noqa: F401  (no such class)
    config = GPT2Config(n_layer=2, n_head=2, n_embd=64, vocab_size=256, n_positions=64)
    model = GPT2LMHeadModel(config)
    options = dict(output_dir=args.output_dir, max_steps=8, per_device_train_batch_size=4,
                   logging_steps=2, save_strategy="no", report_to=[], use_cpu=True,
                   learning_rate=5e-5, dataloader_num_workers=0, disable_tqdm=True)
    if args.bug == "removed-argument":
        options["evaluation_strategy"] = "steps"      # renamed eval_strategy, then removed
    training = TrainingArguments(**options)
    length = 96 if args.bug == "seq-too-long" else 32   # past n_positions (64)
    dataset = SyntheticTokens(64, length, 256, labels=args.bug != "no-labels")
    trainer = Trainer(model=model, args=training, train_dataset=dataset,
                      data_collator=collate if args.bug == "rank1-collator" else None)
    trainer.train()


if __name__ == "__main__":
    main()
