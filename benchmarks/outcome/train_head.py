"""Run speculators' own trainer (`speculators train`, PyPI 0.9.0) on the CPU (runs in the benchmark venv).

Why a wrapper and not a copy: the trainer is theirs, unchanged; it assumes an accelerator in three places,
and this module points each at the CPU at run time before calling their `main`:

1. the trainer moves the model and every batch to `get_local_rank()` (an int, i.e. a CUDA device index):
   here it returns "cpu";
2. it autocasts with `torch.accelerator.current_accelerator().type`, falling back to "cuda" when there is
   none: here the trainer's `device_type` is "cpu" (bf16 autocast on CPU);
3. its step timer calls `torch.accelerator.synchronize()`: a no-op here when there is no accelerator.

Every other argument goes to their config resolver as given, e.g.

    python train_head.py --verifier-name-or-path MODEL --data-path DATA --save-path OUT \\
        --speculator-type eagle3 --draft-attn-impl eager --loss-implementation eager --num-workers 0 ...
"""

from __future__ import annotations

import sys
from typing import Any

import torch


def _no_accelerator() -> bool:
    return torch.accelerator.current_accelerator() is None


def patch_for_cpu() -> None:
    """Point speculators' three device assumptions at the CPU (only when no accelerator is present)."""
    if not _no_accelerator():
        return
    import speculators.train.cli as train_cli
    import speculators.train.trainer as trainer_mod

    trainer_mod.get_local_rank = lambda: "cpu"  # type: ignore[assignment]
    base = trainer_mod.Trainer

    class CpuTrainer(base):  # type: ignore[misc, valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.device_type = "cpu"

    train_cli.Trainer = CpuTrainer  # type: ignore[misc]
    real_sync = torch.accelerator.synchronize

    def synchronize(*args: Any, **kwargs: Any) -> None:
        if not _no_accelerator():
            real_sync(*args, **kwargs)

    torch.accelerator.synchronize = synchronize  # type: ignore[assignment]


def main(argv: list[str]) -> int:
    patch_for_cpu()
    from speculators.train.cli import main as train_main
    from speculators.train.config import TrainConfig

    train_main(TrainConfig.resolve(argv))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
