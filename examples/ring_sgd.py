"""Synchronous data-parallel SGD on a Ring of job-backed processes.

Each member trains the same small network on its own shard of a synthetic
regression problem and averages gradients with torch.distributed's
all_reduce (gloo on CPU, nccl where members have GPUs), so all members end
with the same parameters.  No download, no network:
    python examples/ring_sgd.py [--members N] [--epochs E]
"""
import argparse
import time

from fiberrl.runtime import Ring


def setup(node):
    print(f"rank {node.rank}/{node.size}: rendezvous at {node.master_addr}:{node.master_port}", flush=True)
    node.init_process_group()


def make_shard(rank: int, samples: int):
    import torch
    g = torch.Generator().manual_seed(1000 + rank)  # every rank its own data
    x = torch.randn(samples, 8, generator=g)
    y = torch.sin(x[:, :1]) + 0.5 * x[:, 1:2] * x[:, 2:3] + 0.05 * torch.randn(samples, 1, generator=g)
    return x, y


def train(rank: int, size: int, epochs: int = 10, samples: int = 2048, batch: int = 64):
    import torch
    import torch.distributed as dist

    x, y = make_shard(rank, samples)
    torch.manual_seed(0)  # the same initial parameters on every rank
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    for epoch in range(epochs):
        order = torch.randperm(samples, generator=torch.Generator().manual_seed(epoch * size + rank))
        total = 0.0
        for i in range(0, samples, batch):
            idx = order[i:i + batch]
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x[idx]), y[idx])
            loss.backward()
            for p in model.parameters():
                dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)
                p.grad /= size
            opt.step()
            total += loss.item()
        # one write per line, so lines of different ranks do not interleave
        print(f"rank {rank}, epoch {epoch}: loss {total / (samples // batch):.4f}\n", end="", flush=True)
    return torch.cat([p.detach().flatten() for p in model.parameters()]).numpy()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--members", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=10)
    args = parser.parse_args()
    if args.members < 1 or args.epochs < 1:
        parser.error("need --members >= 1 and --epochs >= 1")

    start = time.perf_counter()
    params = Ring(args.members, lambda rank, size: train(rank, size, args.epochs), setup).run()
    same = all((p == params[0]).all() for p in params[1:])
    print(f"{args.members} members trained {params[0].size} parameters in {time.perf_counter() - start:.2f} s; "
          f"parameters {'identical on every rank' if same else 'DIFFER between ranks'}")
    if not same:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
