"""A real Lightning 2.6 fit on CPU: a small regression model, synthetic data, the stock
TQDMProgressBar (Lightning's default without rich), a CSV logger (so the bar shows v_num),
`self.log("train_loss", ..., prog_bar=True)` every batch. --truth FILE writes each batch's
(global step, loss) as logged, the truth the monitor's points are checked against.
"""

import argparse
import json

import lightning as L
import torch
from lightning.pytorch.callbacks import TQDMProgressBar
from lightning.pytorch.loggers import CSVLogger


class Regression(L.LightningModule):
    def __init__(self, truth: list):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
        self.truth = truth

    def training_step(self, batch, batch_idx):
        inputs, target = batch
        loss = torch.nn.functional.mse_loss(self.net(inputs), target)
        self.log("train_loss", loss, prog_bar=True)
        self.truth.append((self.global_step + 1, loss.item()))
        return loss

    def validation_step(self, batch, batch_idx):
        inputs, target = batch
        self.log("val_loss", torch.nn.functional.mse_loss(self.net(inputs), target), prog_bar=True)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batches", type=int, default=8)
    parser.add_argument("--out", required=True)
    parser.add_argument("--truth", required=True)
    args = parser.parse_args()
    torch.manual_seed(0)
    inputs = torch.randn(args.batches * 4, 8)
    data = torch.utils.data.TensorDataset(inputs, inputs.sum(dim=1, keepdim=True))
    train = torch.utils.data.DataLoader(data, batch_size=4)
    valid = torch.utils.data.DataLoader(data, batch_size=16)
    truth: list = []
    trainer = L.Trainer(max_epochs=args.epochs, accelerator="cpu", devices=1, default_root_dir=args.out,
                        logger=CSVLogger(args.out), callbacks=[TQDMProgressBar()], log_every_n_steps=1,
                        enable_checkpointing=False)
    trainer.fit(Regression(truth), train, valid)
    with open(args.truth, "w") as out:
        json.dump(truth, out)


if __name__ == "__main__":
    main()
