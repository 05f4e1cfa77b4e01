"""A real Hugging Face Trainer run on a tiny model built from a config: no download.

A 2-layer GPT-2 from GPT2Config, trained on a synthetic token dataset made here. The
Trainer prints its own log dicts and tqdm bar as it always does; at the end this script
writes trainer.state.log_history as JSON to the file named by --history, the truth a log
parser's points are checked against.
"""

import argparse
import json

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments


class SyntheticTokens(torch.utils.data.Dataset):
    def __init__(self, count: int, length: int, vocab: int):
        generator = torch.Generator().manual_seed(0)
        self.rows = torch.randint(0, vocab, (count, length), generator=generator)

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> dict:
        return {"input_ids": self.rows[index], "labels": self.rows[index]}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--output-dir", required=True)
    parser.add_argument("--history", required=True)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--logging-steps", "--log-every", type=int, default=5,
                        help="--log-every: the same, under a name orch does not know")
    parser.add_argument("--no-bar", action="store_true", help="disable_tqdm=True, tokens/s on")
    parser.add_argument("--state", default="", help="write trainer_state.json here at the end")
    args = parser.parse_args()

    torch.manual_seed(0)
    config = GPT2Config(n_layer=2, n_head=2, n_embd=64, vocab_size=256, n_positions=64)
    model = GPT2LMHeadModel(config)
    training = TrainingArguments(
        output_dir=args.output_dir, max_steps=args.steps, per_device_train_batch_size=4,
        logging_steps=args.logging_steps, save_strategy="no", report_to=[], use_cpu=True,
        learning_rate=5e-5, dataloader_num_workers=0, disable_tqdm=args.no_bar,
        include_num_input_tokens_seen=args.no_bar)
    trainer = Trainer(model=model, args=training, train_dataset=SyntheticTokens(64, 32, 256))
    trainer.train()
    with open(args.history, "w") as out:
        json.dump(trainer.state.log_history, out)
    if args.state:
        trainer.state.save_to_json(args.state)


if __name__ == "__main__":
    main()
