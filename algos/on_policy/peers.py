"""What PPO's learners share when there are several (``algo.learners=K``, DD-PPO):
every collective of a learner goes through its ``peers``.

``Solo`` is the one learner of ``algo.learners=1``: each method computes what
PPO always has, on its own data.  ``RingPeers`` is a member of a Ring of K
(``torch.distributed``, gloo on CPUs, nccl on GPUs), and each method gives
every member what one learner would compute over the K members' data taken
together: gradients averaged over the members' minibatches (equal in size, so
the average is the gradient of the whole minibatch; under straggler preemption a
cut-short member's are smaller and still weigh 1/K, as DD-PPO's), advantage
normalisation over the whole minibatch (every minibatch's of an epoch in one collective),
the KL that ends an update's epochs.  Observation and
return statistics are shared once a rollout (``share``): within one, each
member takes in its own envs' steps, so that no member waits for another at
every step (which would make a slow member everyone's pace).  Straggler preemption (DD-PPO's, ``algo.preempt_share``)
counts finished rollouts in the Ring's TCPStore.  Members of one host on CPUs sum their gradients through shared
memory (``HostSum``), the same bits as gloo's at a fraction of its time; the rarer collectives stay on gloo.
"""
from __future__ import annotations

import math

import numpy as np
import torch
import torch.distributed as dist

from fiberrl.runtime.primitives.host_sum import HostSum

# a preempted rollout keeps at least this share of its steps (DD-PPO's short-rollout threshold)
PREEMPT_AFTER = 0.25


class Solo:
    """One learner: nothing is shared."""
    rank, size = 0, 1

    def broadcast_parameters(self, module: torch.nn.Module) -> None:
        pass

    def average_gradients(self, parameters) -> None:
        pass

    def share(self, rms) -> None:
        """Make ``rms`` (a ``RunningMeanStd``) hold every learner's rows since the last share."""

    def moments(self, minibatches: list[torch.Tensor]) -> list[tuple]:
        """Each minibatch's (mean, std): with several learners, of every learner's minibatch of that
        number taken together, in one collective for all of them."""
        return [(values.mean(), values.std()) for values in minibatches]

    def mean(self, value: torch.Tensor) -> torch.Tensor:
        return value

    def total(self, value: int) -> int:
        return value

    def gather(self, value) -> list:
        """Every member's ``value``, in rank order."""
        return [value]

    def cut_short(self, update: int, step: int) -> bool:
        """Whether this rollout ends after ``step`` (its other members are done)."""
        return False

    def rollout_done(self, update: int) -> None:
        pass


SOLO = Solo()


class RingPeers(Solo):
    """Member ``rank`` of a Ring of ``size`` learners, in torch.distributed's default group;
    ``store`` is the group's TCPStore and ``preempt_share`` DD-PPO's preemption threshold."""

    def __init__(self, rank: int, size: int, store, num_steps: int, preempt_share: float | None,
                 timeout: float = 300.0):
        self.rank, self.size, self.store, self.timeout = rank, size, store, timeout
        self._host_sum = None  # joined at the first gradient, whose size it needs; False: gloo (not one host)
        # nccl reduces tensors on the GPU only
        self.device = torch.device("cuda") if dist.get_backend() == "nccl" else torch.device("cpu")
        self.preempt_after = max(1, math.ceil(PREEMPT_AFTER * num_steps))
        self.preempt_when = None if preempt_share is None else math.ceil(preempt_share * size)

    def broadcast_parameters(self, module: torch.nn.Module) -> None:
        # seeded alike they are alike already; rank 0's make it so whatever a device computed
        for tensor in module.state_dict().values():
            dist.broadcast(tensor.data, src=0)

    def average_gradients(self, parameters) -> None:
        parameters = [p for p in parameters if p.requires_grad]
        for p in parameters:
            if p.grad is None:  # a parameter the loss did not reach here may be reached elsewhere
                p.grad = torch.zeros_like(p)
        flat = torch.cat([p.grad.reshape(-1) for p in parameters])
        if self._host_sum is None and flat.device.type == "cpu" and self.store is not None:
            self._host_sum = HostSum.join(self.store, self.rank, self.size, flat.numel() * flat.element_size(),
                                          "ppo/gradients", self.timeout) or False
        if self._host_sum:
            self._host_sum.all_reduce(flat)
        else:
            dist.all_reduce(flat)
        flat /= self.size
        offset = 0
        for p in parameters:
            p.grad.copy_(flat[offset:offset + p.numel()].view_as(p.grad))
            offset += p.numel()

    def share(self, rms) -> None:
        from .learner import combine
        count, total, squares = rms.unshared
        shape = rms.mean.shape
        sums = np.concatenate([[count], np.broadcast_to(total, shape).reshape(-1),
                               np.broadcast_to(squares, shape).reshape(-1)])
        sums = self._all_reduce(torch.as_tensor(sums, dtype=torch.float64)).numpy()
        count, width = sums[0], (len(sums) - 1) // 2
        if count > 0:
            mean = sums[1:1 + width] / count
            var = np.maximum(sums[1 + width:] / count - np.square(mean), 0.0)
            rms.mean, rms.var, rms.count = combine(rms.shared, (mean.reshape(shape), var.reshape(shape), count))
        rms.shared, rms.unshared = (rms.mean, rms.var, rms.count), (0, 0.0, 0.0)

    def moments(self, minibatches: list[torch.Tensor]) -> list[tuple]:
        sums = torch.stack([torch.stack([v.double().sum(), v.double().square().sum(),
                                         torch.tensor(float(v.numel()), dtype=torch.float64, device=v.device)])
                            for v in minibatches]).cpu()
        moments = []
        for total, squares, count in self._all_reduce(sums).tolist():
            mean = total / count
            moments.append((mean, math.sqrt(max(squares - count * mean * mean, 0.0) / max(count - 1.0, 1.0))))
        return moments  # the std with torch.std's n - 1

    def mean(self, value: torch.Tensor) -> torch.Tensor:
        return self._all_reduce(value.detach().reshape(1).double().cpu())[0] / self.size

    def total(self, value: int) -> int:
        return int(self._all_reduce(torch.tensor([value], dtype=torch.float64))[0])

    def gather(self, value) -> list:
        values = [None] * self.size
        dist.all_gather_object(values, value)
        return values

    def cut_short(self, update: int, step: int) -> bool:
        return (self.preempt_when is not None and step + 1 >= self.preempt_after
                and self.store.add(self._done_key(update), 0) >= self.preempt_when)

    def rollout_done(self, update: int) -> None:
        if self.preempt_when is not None:
            self.store.add(self._done_key(update), 1)

    def _done_key(self, update: int) -> str:
        return f"ppo/rollouts_done/{update}"

    def _all_reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        """The sum over the members of a CPU tensor, on the CPU."""
        on_device = tensor.to(self.device)
        dist.all_reduce(on_device)
        return on_device.cpu()
