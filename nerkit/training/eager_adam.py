"""torch's Adam and AdamW as they run in eager mode, without importing torch._dynamo: torch wraps the
optimiser's methods (`add_param_group`, `zero_grad`, `step`, `state_dict`) in guards against its
compiler that import torch._dynamo on their first call, 0.8-1 s of a 10 s BiLSTM run
(docs/notebook/speed.md). nerkit never compiles a model, so the guards do nothing for it: these
classes call the same methods and the same update kernel (`torch.optim.adam.adam`, fused or not as
the optimiser's group says) without them. Their state is torch's, so a checkpoint saved by either
loads in the other. With a torch whose wrappers lack what this needs, `eager_class` gives torch's own
class."""

from __future__ import annotations

import torch
from torch.optim import Adam, AdamW, Optimizer
from torch.optim import adam as adam_module


def _unguarded(method):
    """The function a compiler guard wraps (functools.wraps keeps it as `__wrapped__`)."""
    return getattr(method, "__wrapped__", None)


_GUARDED = ("add_param_group", "zero_grad", "state_dict", "load_state_dict")
_ADAM = _unguarded(adam_module.adam)  # the functional update, its guard left out
_AVAILABLE = _ADAM is not None and all(_unguarded(getattr(Optimizer, name)) for name in _GUARDED) \
    and hasattr(Adam, "_init_group") and hasattr(Optimizer, "_accelerator_graph_capture_health_check")


def _step(self, closure=None):
    """Adam.step's body without its guard: no gradient is recorded (as `differentiable=False`, the
    only setting nerkit uses, has it), then each group's update through the functional `adam`."""
    self._accelerator_graph_capture_health_check()  # a CUDA graph capture needs capturable groups
    loss = None
    if closure is not None:
        with torch.enable_grad():
            loss = closure()
    with torch.no_grad():
        for group in self.param_groups:
            params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps = [], [], [], [], [], []
            has_complex = self._init_group(group, params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps)
            beta1, beta2 = group["betas"]
            _ADAM(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps,
                  amsgrad=group["amsgrad"], has_complex=has_complex, beta1=beta1, beta2=beta2, lr=group["lr"],
                  weight_decay=group["weight_decay"], eps=group["eps"], maximize=group["maximize"],
                  foreach=group["foreach"], capturable=group["capturable"], differentiable=group["differentiable"],
                  fused=group["fused"], grad_scale=getattr(self, "grad_scale", None),
                  found_inf=getattr(self, "found_inf", None), decoupled_weight_decay=group["decoupled_weight_decay"])
    return loss


def _eager(base: type) -> type:
    members = {name: _unguarded(getattr(Optimizer, name)) for name in _GUARDED}
    return type(base.__name__, (base,), {**members, "step": _step, "__doc__": f"torch's {base.__name__}, "
                                         "its methods called without their compiler guards (nerkit.training.eager_adam)",
                                         "__module__": __name__})


EAGER = {Adam: _eager(Adam), AdamW: _eager(AdamW)} if _AVAILABLE else {}


def eager_class(base: type) -> type:
    """The eager form of torch.optim.Adam or AdamW (`base` itself where torch's wrappers differ)."""
    return EAGER.get(base, base)
