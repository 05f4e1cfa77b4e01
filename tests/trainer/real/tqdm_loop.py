"""A real tqdm loop: a bar with a description, a total, a rate and a postfix, redrawn with
carriage returns, written to stderr as tqdm does. The postfix values at each step go to
the JSON file named by the first argument (the truth the parser is checked against)."""

import json
import sys
import time

from tqdm import tqdm

truth = []
steps = int(sys.argv[2]) if len(sys.argv) > 2 else 40
bar = tqdm(range(steps), desc="Epoch 1")
for step in bar:
    time.sleep(0.02)
    loss = round(3.0 - step * 0.05, 4)
    bar.set_postfix(loss=loss, lr=1e-4)
    truth.append({"step": step, "loss": loss})
bar.close()
with open(sys.argv[1], "w") as out:
    json.dump(truth, out)
