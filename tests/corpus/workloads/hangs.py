"""Runs that hang, as real ones do: the explain corpus's hang family
(tests/corpus/make_explain_corpus.py). None raises an exception of its own: what ends them
is a watchdog (faulthandler's), torch's collective timeout or whoever stops them.

    python hangs.py --hang NAME
    torchrun --nproc-per-node 2 hangs.py --hang barrier

- deadlock: two threads take two locks in opposite orders (each step logs, then nothing).
- faulthandler: the main thread waits on a queue nobody fills; faulthandler's
  dump_traceback_later prints every thread's stack after --after seconds and exits.
- barrier: under torchrun, rank 1 waits for a file that never comes while rank 0 waits in a
  gloo barrier (the process group's timeout is long: the run just stops making progress).
"""

import argparse
import faulthandler
import os
import queue
import threading
import time

HANGS = ("deadlock", "faulthandler", "barrier")


def deadlock():
    first, second = threading.Lock(), threading.Lock()
    both = threading.Barrier(2)

    def take(one, other, name):
        with one:
            print(f"step=1 worker={name} holds {'first' if one is first else 'second'}", flush=True)
            both.wait()
            with other:
                print("never", flush=True)

    threads = [threading.Thread(target=take, args=(first, second, "forwards"), name="loader"),
               threading.Thread(target=take, args=(second, first, "backwards"), name="writer")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def wait_on_queue(after: float):
    faulthandler.dump_traceback_later(after, exit=True)
    batches: queue.Queue = queue.Queue()
    producer = threading.Thread(target=lambda: time.sleep(3600), name="producer", daemon=True)
    producer.start()
    for step in range(1, 4):
        print(f"step={step} waiting for a batch", flush=True)
        batches.get()


def barrier():
    import datetime

    import torch.distributed as dist
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=3600))
    rank = dist.get_rank()
    for step in range(1, 4):
        print(f"rank {rank} step={step}", flush=True)
        time.sleep(0.2)
    if rank == 1:
        while not os.path.exists("/nonexistent/ready"):
            time.sleep(0.5)
    dist.barrier()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--hang", choices=HANGS, required=True)
    parser.add_argument("--after", type=float, default=5)
    args = parser.parse_args()
    print(f"start hang={args.hang} pid={os.getpid()}", flush=True)
    if args.hang == "deadlock":
        deadlock()
    elif args.hang == "faulthandler":
        wait_on_queue(args.after)
    else:
        barrier()


if __name__ == "__main__":
    main()
