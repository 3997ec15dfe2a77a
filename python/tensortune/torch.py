"""A PyTorch model's workloads as a tensortune suite (`capture`), and a bundle's kernels run inside
the model (`apply`).

Both work through one `TorchFunctionMode`, which sees every torch function the model calls:
`nn.Linear` (through `F.linear`), `F.linear`, `torch.matmul`/`mm`/`bmm`/`addmm`/`baddbmm`, the `@`
operator and the Tensor methods of the same names, and `nn.Conv2d` (through `F.conv2d`). One
function, `_workload`, turns such a call into its workload key, so capture and apply agree by
construction on what a call is.

- Linear/matmul: row-major Y[rows, n] = X[rows, k] @ W[k, n] is the key's column-major
  D (n x rows) = op(A) op(B) with op(A) = W^T, op(B) = X^T; leading dimensions of X fold into rows
  when W is a matrix, otherwise they are the suite entry's `batch` (a batched matmul).
- Conv2d: NCHW shapes, NHWC in the key (channels_last tensors are NHWC in memory); one group only.
- Epilogue, in the key (`_Chain`): a conv's or linear layer's own bias, then for a conv an
  eval-mode batch norm of its output (folded into the weights and a per-channel bias), then an
  eval-mode dropout (nothing), the add of a tensor of its shape (a residual block's identity),
  then ReLU or tanh-GELU: `relu(bn(conv(x)) + identity)` is one kernel,
  `conv2d/.../beta=1,epi=bias+relu`; BERT's `dense(h) + input` is `matmul/.../alpha=1,beta=1,epi=bias`.
  A batched product's activation is only recorded (the suite entry's `epilogue`).

`apply` runs a conv or linear layer whose operands the kernels can read (CUDA; a conv's
channels_last, a linear's dense) and whose shape has a fused kernel in the bundle (and any conv
the bundle has no kernel for), lazily: it hands back an empty output and absorbs the batch norm,
dropout, add and activation that follow it, then, before any other op runs, launches the bundle's
kernel of that whole chain where it was the faster timed in place (`_timed`), or else PyTorch's
way: cuDNN's fused conv-bias-add-ReLU, or the op (batch norm folded), the add and the
activation. So it assumes
that the op's output, and each op's in the chain, is read only by the next op of the chain (true
of torchvision's and timm's conv-BN-ReLU and bottleneck blocks and of BERT's output layers).

`capture` needs no GPU: run it on CPU tensors, or on the `meta` device for shapes alone (a half
precision model on `meta` captures half precision keys without computing anything).
"""

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from . import bundle as _bundle
from .suite import (
    TYPES,
    SuiteBuilder,
    conv2d_key,
    join_epilogue,
    matmul_key,
    matmul_layout,
    parse_key,
    write_suite,
)

_LINEAR = {F.linear}
_MATMUL = {torch.matmul, torch.Tensor.matmul, torch.Tensor.__matmul__, torch.mm, torch.Tensor.mm}
_BMM = {torch.bmm, torch.Tensor.bmm}
_ADDMM = {torch.addmm, torch.Tensor.addmm, torch.baddbmm, torch.Tensor.baddbmm}
_CONV = {F.conv2d}
_BATCH_NORM = {F.batch_norm}
_DROPOUT = {F.dropout, torch.dropout}
_ADD = {torch.add, torch.Tensor.add, torch.Tensor.add_, torch.Tensor.__add__, torch.Tensor.__iadd__, torch.Tensor.__radd__}
_ACTIVATIONS = {
    torch.relu: "relu",
    torch.relu_: "relu",
    F.relu: "relu",
    torch.Tensor.relu: "relu",
    torch.Tensor.relu_: "relu",
    F.gelu: "gelu",
}
# Calls that only read metadata: they neither consume an op's output nor end its epilogue.
_METADATA = {"__get__", "size", "dim", "stride", "is_contiguous", "numel", "data_ptr", "__len__", "element_size"}


def _dtype_name(t, conv):
    if t.dtype == torch.float16:
        return "f16"
    if t.dtype == torch.bfloat16:
        return "bf16"
    if t.dtype == torch.float32:
        tf32 = torch.backends.cudnn.allow_tf32 if conv else torch.backends.cuda.matmul.allow_tf32
        return "tf32" if tf32 else "f32"
    return None


def _rows_contiguous(t):
    """Whether the last dimension is the contiguous one (row-major rows)."""
    return t.dim() >= 1 and (t.stride(-1) == 1 or t.size(-1) == 1)


def _cols_contiguous(t):
    return t.dim() >= 2 and (t.stride(-2) == 1 or t.size(-2) == 1)


def _dense(t):
    """Whether `t` is one dense block, read row- or (for a matrix) column-major."""
    return t.is_contiguous() or (t.dim() == 2 and t.t().is_contiguous())


def _pair(v):
    return (v, v) if isinstance(v, int) else tuple(v)


class _Call:
    """A recognised call: its key, batch, epilogue parts and the operands as the kernel reads them."""

    def __init__(self, kind, key, batch, epilogue, operands, out_shape):
        self.kind = kind
        self.key = key
        self.batch = batch
        self.epilogue = epilogue
        self.operands = operands
        self.out_shape = out_shape


class _Chain:
    """A conv or linear layer and what has followed it so far: an eval-mode batch norm (a conv's),
    a residual add, an activation, in that order (the kernel's epilogue order), each taking the
    previous one's output; eval-mode dropouts between them do nothing."""

    def __init__(self, call, out):
        self.call = call
        self.out = out  # the tensor every absorbed op returns
        self.bn = None  # (running_mean, running_var, weight, bias, eps)
        self.identity = None
        self.activation = None

    def parts(self):
        """The epilogue parts (`bias` for the conv's own bias or a folded batch norm)."""
        bias = self.call.operands[2] is not None or self.bn is not None
        return (["bias"] if bias else []) + ([self.activation] if self.activation else [])

    def key(self):
        fields = parse_key(self.call.key)
        epilogue = join_epilogue(self.parts())
        if fields["op"] == "matmul":
            return matmul_key(fields["m"], fields["n"], fields["k"], fields["layout"], _KEY_DTYPE[fields["types"]],
                              epilogue=epilogue, residual=self.identity is not None)
        return conv2d_key(fields["n"], fields["h"], fields["w"], fields["c"], fields["k"], fields["r"], fields["s"],
                          fields["pad"], fields["stride"], fields["dilation"], _KEY_DTYPE[fields["types"]],
                          epilogue=epilogue, residual=self.identity is not None)

    def absorb(self, func, args, kwargs):
        """Takes `func(*args, **kwargs)` into the chain when it is the next part and reads the
        chain's output; returns whether it did."""
        if not args or not torch.is_tensor(args[0]):
            return False
        if func in _DROPOUT:
            a = dict(zip(("input", "p", "training", "inplace"), args))
            a.update(kwargs)
            training = a.get("training", a.get("train", True))
            return a["input"] is self.out and (not training or a.get("p", 0.5) == 0)
        if func in _BATCH_NORM:
            names = ("input", "running_mean", "running_var", "weight", "bias", "training", "momentum", "eps")
            a = dict(zip(names, args))
            a.update(kwargs)
            if (self.call.kind != "conv2d" or a["input"] is not self.out or a.get("training", False) or self.bn is not None
                    or self.identity is not None or self.activation is not None
                    or a.get("running_mean") is None or a.get("running_var") is None):
                return False
            self.bn = (a["running_mean"], a["running_var"], a.get("weight"), a.get("bias"), a.get("eps", 1e-5))
            return True
        if func in _ADD:
            if len(args) != 2 or kwargs.get("alpha", 1) != 1 or self.identity is not None or self.activation is not None:
                return False
            a, b = args
            other = b if a is self.out else a if b is self.out else None
            if (not torch.is_tensor(other) or other is self.out or other.shape != self.out.shape
                    or other.dtype != self.out.dtype):
                return False
            self.identity = other
            if b is self.out and func in (torch.Tensor.add_, torch.Tensor.__iadd__):
                # `identity += conv_out` (torchvision's `out += identity` where the conv is the
                # downsample): the sum lands in the other tensor, which the kernel reads as C
                # and writes as D, element by element.
                self.out = a
            return True
        activation = _ACTIVATIONS.get(func)
        if activation and args[0] is self.out and self.activation is None:
            if activation == "gelu":
                # `nn.GELU()` and `F.gelu` default to the exact (erf) form, keyed `gelu_erf`;
                # `approximate="tanh"` is the tanh form, keyed `gelu` (cuBLASLt's).
                approximate = kwargs.get("approximate", args[1] if len(args) > 1 else "none")
                if approximate not in ("none", "tanh"):
                    return False
                activation = "gelu" if approximate == "tanh" else "gelu_erf"
            self.activation = activation
            return True
        return False


#: Key types -> the dtype name `conv2d_key` takes.
_KEY_DTYPE = {tuple(v.split(",")): k for k, v in TYPES.items()}


def _matmul_call(x, w, bias, kind):
    """Y = X @ W (+ bias): x [..., rows, k], w [k, n] or [..., k, n]."""
    if x.dim() < 2 or w.dim() < 2:
        return None, "a matrix-vector product"
    if x.dtype != w.dtype:
        return None, f"mixed dtypes {x.dtype} and {w.dtype}"
    dtype = _dtype_name(x, conv=False)
    if dtype is None:
        return None, f"dtype {x.dtype}"
    k, n = w.shape[-2], w.shape[-1]
    if x.shape[-1] != k:
        return None, "inner dimensions differ"
    x_rows = _rows_contiguous(x)
    w_rows = _rows_contiguous(w)
    if not (x_rows or _cols_contiguous(x)) or not (w_rows or _cols_contiguous(w)):
        return None, "an operand with neither rows nor columns contiguous"
    layout = matmul_layout(x_rows, w_rows)
    lead = tuple(x.shape[:-2])
    if w.dim() == 2:
        rows = x.shape[-2]
        for d in lead:
            rows *= d
        batch = None
        if lead and not x_rows:
            return None, "a batched X with contiguous columns against a matrix W"
    else:
        rows = x.shape[-2]
        batch = 1
        for d in torch.broadcast_shapes(lead, tuple(w.shape[:-2])):
            batch *= d
    key = matmul_key(int(n), int(rows), int(k), layout, dtype)
    parts = ["bias"] if bias is not None else []
    out_shape = tuple(x.shape[:-1]) + (n,) if w.dim() == 2 else None
    return _Call(kind, key, batch if batch and batch > 1 else None, parts, (x, w, bias), out_shape), None


def _conv_call(args, kwargs):
    names = ("input", "weight", "bias", "stride", "padding", "dilation", "groups")
    a = dict(zip(names, args))
    a.update(kwargs)
    x, w = a["input"], a["weight"]
    bias = a.get("bias")
    stride, dilation = _pair(a.get("stride", 1)), _pair(a.get("dilation", 1))
    groups = a.get("groups", 1)
    if groups != 1:
        return None, f"groups={groups} (grouped and depthwise convolutions are not tuned)"
    if x.dim() != 4:
        return None, f"a {x.dim()}-D input"
    dtype = _dtype_name(x, conv=True)
    if dtype is None:
        return None, f"dtype {x.dtype}"
    padding = a.get("padding", 0)
    r, s = w.shape[2], w.shape[3]
    if padding == "valid":
        padding = (0, 0)
    elif padding == "same":
        if any(st != 1 for st in stride) or any((d * (k - 1)) % 2 for d, k in zip(dilation, (r, s))):
            return None, "padding='same' that pads unevenly"
        padding = (dilation[0] * (r - 1) // 2, dilation[1] * (s - 1) // 2)
    padding = _pair(padding)
    n, c, h, wd = (int(v) for v in x.shape)
    key = conv2d_key(n, h, wd, c, int(w.shape[0]), int(r), int(s), padding, stride, dilation, dtype)
    p = (h + 2 * padding[0] - dilation[0] * (r - 1) - 1) // stride[0] + 1
    q = (wd + 2 * padding[1] - dilation[1] * (s - 1) - 1) // stride[1] + 1
    parts = ["bias"] if bias is not None else []
    call = _Call("conv2d", key, None, parts, (x, w, bias), (n, int(w.shape[0]), p, q))
    call.geometry = (stride, padding, dilation)
    return call, None


def _workload(func, args, kwargs):
    """(call, None) when `func(*args, **kwargs)` is a tunable op, (None, why not) when it is one of
    the ops but cannot be tuned, (None, None) when it is some other function."""
    try:
        if func in _LINEAR:
            x, w = args[0], args[1] if len(args) > 1 else kwargs["weight"]
            bias = args[2] if len(args) > 2 else kwargs.get("bias")
            return _matmul_call(x, w.t(), bias, "linear")
        if func in _MATMUL or func in _BMM:
            return _matmul_call(args[0], args[1], None, "matmul")
        if func in _ADDMM:
            if kwargs.get("beta", 1) not in (0, 1) or kwargs.get("alpha", 1) != 1:
                return None, "alpha/beta scaling"
            return _matmul_call(args[1], args[2], args[0], "addmm")
        if func in _CONV:
            return _conv_call(args, kwargs)
    except (IndexError, KeyError, AttributeError, TypeError) as e:
        return None, f"unexpected arguments ({e})"
    return None, None


def _chains(call):
    """Whether what follows `call` may go into its key: a conv's, or a linear layer's (one weight
    matrix; a batched product's activation is only recorded)."""
    return call.kind == "conv2d" or (call.kind in ("linear", "addmm") and call.batch is None and call.out_shape is not None)


def _name(func):
    return getattr(func, "__name__", str(func))


class _Capture(TorchFunctionMode):
    def __init__(self, builder, where):
        super().__init__()
        self.builder = builder
        self.where = where
        self.pending = None  # (call, output, op name): an op whose epilogue may still follow

    def _flush(self):
        if self.pending is not None:
            call, out, op = self.pending
            if isinstance(out, _Chain):
                self.builder.add(out.key(), op=op)
            else:
                self.builder.add(call.key, op=op, batch=call.batch, epilogue=join_epilogue(call.epilogue))
            self.pending = None

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if _name(func) in _METADATA:
            return func(*args, **kwargs)
        activation = _ACTIVATIONS.get(func)
        if self.pending is not None and isinstance(self.pending[1], _Chain):
            chain = self.pending[1]
            if chain.absorb(func, args, kwargs):
                chain.out = func(*args, **kwargs)
                return chain.out
            self._flush()
        if self.pending is not None:
            call, out, _ = self.pending
            if activation and args and args[0] is out and len(call.epilogue) < 3:
                call.epilogue.append(activation)
                result = func(*args, **kwargs)
                self._flush()
                return result
            self._flush()
        call, why = _workload(func, args, kwargs)
        out = func(*args, **kwargs)
        op = self.where[-1] if self.where else _name(func)
        if call is not None:
            self.pending = (call, _Chain(call, out) if _chains(call) else out, op)
        elif why is not None:
            self.builder.skip(f"{op}: {_name(func)}: {why}")
        return out


def _module_names(model, stack):
    """Forward hooks that keep `stack` holding the running module's qualified name."""
    # Both hooks must return None: a forward hook's return value replaces the module's output.
    def enter(label):
        return lambda _m, _a: stack.append(label)

    def leave(_m, _a, _o):
        stack.pop()

    handles = []
    for name, m in model.named_modules():
        handles.append(m.register_forward_pre_hook(enter(name or type(m).__name__)))
        handles.append(m.register_forward_hook(leave))
    return handles


def capture(model, example_inputs, path=None, name=None, description=None):
    """Runs `model(*example_inputs)` once (no gradients) and returns the suite of its distinct
    matmul, batched matmul and conv2d workloads with their counts; writes it to `path` when given.

    `example_inputs` is a tuple of positional inputs (a lone tensor is taken as one input) or a
    dict of keyword inputs. The suite's `skipped` list (not read by the CLI) names the ops of those
    kinds that cannot be tuned (grouped convolutions, unsupported dtypes, ...).
    """
    if isinstance(example_inputs, torch.Tensor):
        example_inputs = (example_inputs,)
    builder = SuiteBuilder()
    stack = []
    handles = _module_names(model, stack)
    mode = _Capture(builder, stack)
    try:
        with torch.no_grad(), mode:
            if isinstance(example_inputs, dict):
                model(**example_inputs)
            else:
                model(*example_inputs)
            mode._flush()
    finally:
        for h in handles:
            h.remove()
    name = name or type(model).__name__
    suite = builder.suite(name, description or f"The matmul and conv2d workloads of {name} (tensortune.torch.capture).")
    if builder.skipped:
        suite["skipped"] = builder.skipped
    if path is not None:
        write_suite(suite, path)
    return suite


class Applied:
    """What `apply` did: the plan, the kernels loaded, and launch counts (ours / PyTorch's)."""

    def __init__(self, model, plan, original_forward):
        self.model = model
        self.plan = plan
        self.kernels = {}
        self.workspaces = {}
        self.ours = 0
        self.kept = {}
        self.fused = {}  # conv chain key -> launches of its fused kernel
        self.folded = {}  # (weight, batch norm) pointers -> the folded weight and bias
        self.forwards = 0  # forwards run since apply: the counts above are over all of them
        # A chain whose kernel lost runs cuDNN's fused conv-bias-add-ReLU (PyTorch's
        # `cudnn_convolution_add_relu`) where it can, else conv, add and ReLU apart.
        self.cudnn_fused = True
        # A conv the bundle has no kernel for (ResNet's 3-channel stem) runs as a chain too: its
        # eval batch norm folded into the weights, then cuDNN's fused call as above (H200,
        # ResNet-50 N=32, same rounds: 1076 us a forward against 1166 us with the stem's batch
        # norm and ReLU as two more passes, 60 and 25 us).
        self.chain_untuned = True
        # A chain with a kernel in the bundle, won or lost, runs whichever of it and PyTorch's
        # way was the faster when both were timed in place on the first forward (`_timed`).
        self.calibrate = True
        self.timed = {}  # chain key -> (ours us, PyTorch's us), timed in place
        self._original_forward = original_forward

    def remove(self):
        """Restores the model's own forward."""
        self.model.forward = self._original_forward

    def reset_counts(self):
        """Zeroes the launch counts and forwards (the kernels, folded weights and in-place timings
        stay): the next report is of what runs from here on."""
        self.ours, self.kept, self.fused, self.forwards = 0, {}, {}, 0

    def report(self):
        return {"kernels": sorted(self.kernels), "ours": self.ours, "kept": dict(self.kept), "fused": dict(self.fused),
                "forwards": self.forwards, "timed": {k: list(v) for k, v in self.timed.items()}}


def _kernel(applied, entry):
    from . import cuda

    k = applied.kernels.get(entry["name"])
    if k is None:
        arch = applied.plan.arch
        path = f"{applied.plan.directory}/{_bundle.cubin_for(entry, arch)}"
        k = cuda.Kernel(entry, path)
        applied.kernels[entry["name"]] = k
        if entry.get("workspace_bytes", 0) > 0:
            applied.workspaces[entry["name"]] = torch.zeros(entry["workspace_bytes"], dtype=torch.uint8, device="cuda")
    return k


def _pointers(applied, entry, a, b, out, c=None, bias=None):
    ws = applied.workspaces.get(entry["name"])
    pointers = {"a": a.data_ptr(), "b": b.data_ptr(), "c": (c if c is not None else out).data_ptr(), "d": out.data_ptr()}
    pointers["workspace"] = ws.data_ptr() if ws is not None else out.data_ptr()
    if bias is not None:
        pointers["bias"] = bias.data_ptr()
    return pointers


def _conv_ready(x, w):
    """Whether a conv's operands are laid out as the kernels read them."""
    return (x.is_cuda and w.is_cuda and x.is_contiguous(memory_format=torch.channels_last)
            and w.is_contiguous(memory_format=torch.channels_last))


def _ready(call):
    """Whether a call's operands are laid out as the kernels read them (a conv's channels_last; a
    linear's dense, with a contiguous bias)."""
    x, w, bias = call.operands
    if call.kind == "conv2d":
        return _conv_ready(x, w)
    return x.is_cuda and w.is_cuda and _dense(x) and _dense(w) and (bias is None or bias.is_contiguous())


def _launch(applied, call, entry):
    """Runs `call` with the bundle's kernel; returns the output, or None when the tensors are not
    laid out as the kernel reads them (PyTorch's op then runs)."""
    x, w, bias = call.operands
    if not (x.is_cuda and w.is_cuda):
        return None
    if call.kind == "conv2d":
        if not _conv_ready(x, w):
            return None
        out = torch.empty(call.out_shape, dtype=x.dtype, device=x.device, memory_format=torch.channels_last)
        a, b = x, w
    else:
        if call.batch is not None or call.out_shape is None:
            return None  # batched products keep PyTorch's op (the bundle's kernels are one matrix)
        # The key's A is W^T, its B is X^T; both dense as stored (the key's layout says which
        # way round), with no gaps between rows.
        if not (_dense(x) and _dense(w)):
            return None
        out = torch.empty(call.out_shape, dtype=x.dtype, device=x.device)
        a, b = w, x
    kernel = _kernel(applied, entry)
    kernel.launch(_pointers(applied, entry, a, b, out), torch.cuda.current_stream().cuda_stream)
    if bias is not None:
        if call.kind == "conv2d":
            out.add_(bias.view(1, -1, 1, 1))
        else:
            out.add_(bias)
    return out


def _folded(applied, chain):
    """The conv's weight and bias with the chain's batch norm folded in (eval: y = (conv(x) + b0 -
    mean) * g / sqrt(var + eps) + beta), computed in f32 once per weight and cached: (weight in
    the conv's dtype and channels_last, bias as a [K] vector of that dtype, or None)."""
    x, w, b0 = chain.call.operands
    if chain.bn is None:
        return w, b0
    mean, var, gamma, beta, eps = chain.bn
    ident = (w.data_ptr(), mean.data_ptr(), var.data_ptr(), None if gamma is None else gamma.data_ptr())
    hit = applied.folded.get(ident)
    if hit is None:
        scale = torch.rsqrt(var.float() + eps)
        if gamma is not None:
            scale = scale * gamma.float()
        shift = -mean.float() * scale
        if b0 is not None:
            shift = shift + b0.float() * scale
        if beta is not None:
            shift = shift + beta.float()
        wf = (w.float() * scale.view(-1, 1, 1, 1)).to(w.dtype).contiguous(memory_format=torch.channels_last)
        hit = (wf, shift.to(w.dtype).contiguous())
        applied.folded[ident] = hit
    return hit


def _run_chain(applied, chain):
    """Fills `chain.out` with the whole chain: the bundle's fused kernel where it is the faster
    (timed in place, `_timed`, or else where it won the tuning), else PyTorch's conv (batch norm
    folded) or linear, add and activation."""
    x, _, _ = chain.call.operands
    conv = chain.call.kind == "conv2d"
    key = chain.key()
    entry, reason = applied.plan.decide(key, any_winner=applied.calibrate)
    w, bias = _folded(applied, chain)
    identity = chain.identity
    fmt = torch.channels_last if conv else torch.contiguous_format
    if entry is not None and not all(t.is_contiguous(memory_format=fmt) for t in (chain.out, identity) if t is not None):
        entry, reason = None, "a residual or output not laid out as the kernel reads it"
    if entry is not None and bias is None and "bias" in key:
        entry, reason = None, "no bias to pass"
    if entry is not None and applied.calibrate:
        entry, reason = _timed(applied, chain, key, entry, w, bias)
    if entry is not None:
        # The key's A and B: a conv's input and filter; a linear's W^T and X^T (see _launch).
        a, b = (x, w) if conv else (w, x)
        kernel = _kernel(applied, entry)
        kernel.launch(_pointers(applied, entry, a, b, chain.out, c=identity, bias=bias),
                      torch.cuda.current_stream().cuda_stream)
        applied.ours += 1
        applied.fused[key] = applied.fused.get(key, 0) + 1
        return
    applied.kept[reason] = applied.kept.get(reason, 0) + 1
    # X @ W^T (+ bias) is written into the chain's output where it is its own buffer (no copy;
    # not while autograd records, which refuses out=); `identity += linear(x)` adds into the
    # identity.
    grad = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (x, w, bias))
    into = None if conv or chain.out is identity or not chain.out.is_contiguous() or grad else chain.out
    out = _fallback(applied, chain, w, bias, into)
    if out.data_ptr() == chain.out.data_ptr() and out.shape == chain.out.shape:
        return
    if out.shape == chain.out.shape and out.stride() == chain.out.stride() and not (
            torch.is_grad_enabled() and out.requires_grad) and (chain.out is not identity or _whole(identity)):
        # The chain's output takes the result's storage instead of a copy of it. It is our own
        # empty tensor, which no view shares yet (any op but the chain's flushed it before), or,
        # for `identity += conv(x)`, the identity, which only the chain reads (the assumption
        # above) and which is no view of a larger buffer (H200, ResNet-50 N=32: the copies into
        # the two downsample blocks' identities whose fused kernel lost took 28 us a forward).
        chain.out.set_(out)
    else:
        chain.out.copy_(out)


def _fallback(applied, chain, w, bias, into=None):
    """PyTorch's run of the chain (weight `w` and `bias` with the batch norm folded): cuDNN's
    fused conv-bias-(add-)ReLU where it takes the operands, else the conv or linear layer, the
    add and the activation; returns the result, writing no tensor of the chain's (a linear's
    product goes into `into` when given)."""
    x, identity, activation = chain.call.operands[0], chain.identity, chain.activation
    if chain.call.kind == "conv2d":
        stride, padding, dilation = chain.call.geometry
        out = None
        if activation == "relu" and applied.cudnn_fused and _cudnn_fusable(x, w, identity):
            # cuDNN's fused conv-bias-(add-)ReLU: the vendor call the bundle's vendor time is of
            # (the model's predicted time assumes it), not conv, add and ReLU as three passes.
            try:
                if identity is not None:
                    out = torch.cudnn_convolution_add_relu(x, w, identity, 1.0, bias, stride, padding, dilation, 1)
                else:
                    out = torch.cudnn_convolution_relu(x, w, bias, stride, padding, dilation, 1)
                activation = None
            except RuntimeError as e:
                applied.kept[f"cuDNN's fused call failed, ran unfused: {e}"] = 1
                applied.cudnn_fused = False
        if out is None:
            out = F.conv2d(x, w, bias, stride, padding, dilation)
            if identity is not None:
                out = out.add_(identity)
    else:
        x2 = x.reshape(-1, x.shape[-1])
        y = into.view(-1, w.shape[-1]) if into is not None else None
        if bias is not None:
            y = torch.addmm(bias, x2, w, out=y)
        else:
            y = torch.mm(x2, w, out=y)
        if identity is not None:
            y = y.add_(identity.reshape(y.shape))
        out = y.view(chain.out.shape)
    if activation == "relu":
        out = out.relu_()
    elif activation == "gelu":
        out = F.gelu(out, approximate="tanh")
    elif activation == "gelu_erf":
        out = F.gelu(out)
    return out


#: In-place timing (`_timed`): launches per sample, and the GPU sleep queued before them (in
#: cycles, ~1.5 ms at H200 clocks) so that the host has enqueued them all before the first runs:
#: the events then time the GPU, not Python's launch path (~20-50 us a launch through ctypes).
_TIMED_RUNS = 10
_TIMED_SLEEP_CYCLES = 3_000_000


def _timed(applied, chain, key, entry, w, bias):
    """(entry, None) when the bundle's kernel of `key` is the faster in place, else (None, why):
    both ways are timed once per key, on this chain's operands (outputs to scratch), outside
    CUDA-graph capture; a key first seen during capture keeps the tuning's decision. The tuner
    times each kernel alone; in a model the vendor's time can differ (PyTorch's fallback for a
    residual linear is cuBLASLt's GEMM with its bias and then an add, not the fused call the
    bundle's vendor time is of)."""
    timed = applied.timed.get(key)
    if timed is None and not torch.cuda.is_current_stream_capturing():
        timed = applied.timed[key] = _time_both(applied, chain, entry, w, bias)
    if timed is None:
        return applied.plan.decide(key)
    ours, theirs = timed
    if ours < theirs:
        return entry, None
    return None, f"PyTorch's was faster in place ({theirs:.2f} us vs ours {ours:.2f} us)"


def _time_both(applied, chain, entry, w, bias):
    """GPU microseconds per run of the bundle's kernel and of `_fallback` on the chain's operands
    (the better of two samples of `_TIMED_RUNS` runs each, alternating); outputs go to scratch
    tensors, so the chain's (and an identity it adds into) are not written."""
    x, identity = chain.call.operands[0], chain.identity
    conv = chain.call.kind == "conv2d"
    scratch = torch.empty_like(chain.out)
    a, b = (x, w) if conv else (w, x)
    kernel = _kernel(applied, entry)
    stream = torch.cuda.current_stream()
    runs = {
        "ours": lambda: kernel.launch(_pointers(applied, entry, a, b, scratch, c=identity, bias=bias), stream.cuda_stream),
        "theirs": lambda: _fallback(applied, chain, w, bias),
    }
    sleep = getattr(torch.cuda, "_sleep", None)
    best = {}
    for name in ("ours", "theirs", "ours", "theirs"):
        runs[name]()  # the first: loads, plans, allocations
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        stream.synchronize()
        if sleep is not None:
            sleep(_TIMED_SLEEP_CYCLES)
        start.record(stream)
        for _ in range(_TIMED_RUNS):
            runs[name]()
        end.record(stream)
        end.synchronize()
        us = start.elapsed_time(end) * 1e3 / _TIMED_RUNS
        best[name] = min(us, best.get(name, us))
    return best["ours"], best["theirs"]


def _whole(t):
    """Whether `t` is no view: its own storage, all of it."""
    return t._base is None and t.storage_offset() == 0 and t.untyped_storage().nbytes() == t.numel() * t.element_size()


def _cudnn_fusable(x, w, identity):
    """Whether cuDNN's fused conv-bias-add-ReLU takes these operands as the kernels would (CUDA,
    half precision, channels_last; PyTorch's `cudnn_convolution_*relu`)."""
    cl = torch.channels_last
    return (x.is_cuda and x.dtype in (torch.float16, torch.bfloat16) and torch.backends.cudnn.is_available()
            and hasattr(torch, "cudnn_convolution_add_relu") and x.is_contiguous(memory_format=cl)
            and w.is_contiguous(memory_format=cl) and (identity is None or identity.is_contiguous(memory_format=cl)))


class _Apply(TorchFunctionMode):
    def __init__(self, applied):
        super().__init__()
        self.applied = applied
        self.chain = None  # a conv whose output is still to be computed, and what followed it

    def flush(self):
        if self.chain is not None:
            chain, self.chain = self.chain, None
            _run_chain(self.applied, chain)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.chain is not None:
            if _name(func) in _METADATA:
                return func(*args, **kwargs)
            if self.chain.absorb(func, args, kwargs):
                return self.chain.out
            self.flush()
        call, why = _workload(func, args, kwargs)
        if call is None:
            if why is not None:
                self.applied.kept[why] = self.applied.kept.get(why, 0) + 1
            return func(*args, **kwargs)
        plan = self.applied.plan
        lazy = plan.chains(call.key) or (self.applied.chain_untuned and call.kind == "conv2d" and call.key not in plan.entries)
        if _chains(call) and lazy and _ready(call):
            x = call.operands[0]
            fmt = torch.channels_last if call.kind == "conv2d" else torch.contiguous_format
            out = torch.empty(call.out_shape, dtype=x.dtype, device=x.device, memory_format=fmt)
            self.chain = _Chain(call, out)
            return out
        entry, reason = self.applied.plan.decide(call.key, call.epilogue)
        out = _launch(self.applied, call, entry) if entry is not None else None
        if out is None:
            reason = reason or "operands not laid out as the kernel reads them"
            self.applied.kept[reason] = self.applied.kept.get(reason, 0) + 1
            return func(*args, **kwargs)
        self.applied.ours += 1
        return out


def apply(model, bundle_dir, arch=None):
    """Makes `model`'s forward run the bundle's kernel for each captured op where ours won the
    tuning (and keep PyTorch's op where the vendor won, the shape was not tuned, or the tensors
    are laid out otherwise). Kernels launch on `torch.cuda.current_stream()`, so a CUDA graph
    captured around the forward holds them. Returns an `Applied` (`.remove()` undoes it)."""
    if arch is None:
        major, minor = torch.cuda.get_device_capability()
        arch = major * 10 + minor
    plan = _bundle.Plan.load(str(bundle_dir), arch=arch)
    original = model.forward
    applied = Applied(model, plan, original)
    mode = _Apply(applied)

    def forward(*args, **kwargs):
        applied.forwards += 1
        try:
            with mode:
                return original(*args, **kwargs)
        finally:
            mode.flush()  # a chain the forward ended with (outside the mode: its ops run as they are)

    model.forward = forward
    return applied

