"""Workload keys and suite files, in plain Python (no torch).

A suite is the JSON file `tensortune tune --suite` reads: a name, a description and a list of
workloads, each a tensortune workload key plus, for a model, how many times the model runs it
(`count`), how many matrices a batched matmul multiplies (`batch`), what follows a matmul
(`epilogue`: `relu`, `gelu` (tanh form), `gelu_erf` (exact), ... after a batched product, recorded for the reader) and where the
model runs it (`ops`). A linear layer's and a conv2d's epilogue is in its key (`beta=1,epi=bias`:
a linear's bias and the residual add after it; `/beta=1,epi=bias+relu`: batch norm folded into a
per-channel bias, the residual add, ReLU), so the fused kernel is what is tuned.

Keys (the tracker's canonical spelling; C and D column-major, as BLAS):

    matmul/m<M>n<N>k<K>/<layout>/<input>,<accumulator>,<output>/alpha=1,beta=<0|1>[,epi=<parts>]
    conv2d/n<N>h<H>w<W>c<C>/k<K>r<R>s<S>/pad<h>x<w>,stride<h>x<w>,dil<h>x<w>/nhwc/<types>[/beta=1][,epi=<parts>]

A row-major product Y[rows, n] = X[rows, k] @ W[k, n] is, column-major, Y^T = W^T X^T: the key's M
is n, its N is rows, op(A) is W^T and op(B) is X^T (`matmul_layout` says which letters).
"""

import json
import re

#: Input dtype -> (input, accumulator, output) of the key, as PyTorch computes it: half types
#: accumulate in f32 and write their own type; f32 is exact (CUDA cores) or tf32 (tensor cores).
TYPES = {
    "f16": "f16,f32,f16",
    "bf16": "bf16,f32,bf16",
    "f32": "f32,f32,f32",
    "tf32": "tf32,f32,f32",
}
LAYOUTS = ("nn", "nt", "tn", "tt")
#: Epilogue parts a suite may name, in the order they apply.
EPILOGUE_PARTS = ("bias", "relu", "gelu", "gelu_erf")

_MATMUL = re.compile(
    r"^matmul/m(\d+)n(\d+)k(\d+)/(nn|nt|tn|tt)/([a-z0-9]+),([a-z0-9]+),([a-z0-9]+)/alpha=([^,]+),beta=([^,]+)"
    r"(?:,scale=([a-z]+))?(?:,epi=([a-z_+]+))?$"
)
_CONV = re.compile(
    r"^conv2d/n(\d+)h(\d+)w(\d+)c(\d+)/k(\d+)r(\d+)s(\d+)/pad(\d+)x(\d+),stride(\d+)x(\d+),dil(\d+)x(\d+)/nhwc/"
    r"([a-z0-9]+),([a-z0-9]+),([a-z0-9]+)(?:/(?:(beta=1)(?:,|$))?(?:epi=([a-z_+]+))?)?$"
)


def _positive(field, value):
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{field} must be a positive integer, got {value!r}")
    return value


def _types(dtype):
    try:
        return TYPES[dtype]
    except KeyError:
        raise ValueError(f"dtype {dtype!r} is not supported; allowed: {', '.join(TYPES)}") from None


def matmul_key(m, n, k, layout, dtype, epilogue=None, residual=False):
    """The key of D (M x N, column-major) = act(op(A) (M x K) op(B) (K x N) + C + bias[m]) in
    `dtype`: `epilogue` as `join_epilogue` spells it (`bias`, `bias+relu`, ...; per row of D, a
    linear layer's output feature), `residual` a C of D's shape added (beta=1)."""
    for field, v in (("m", m), ("n", n), ("k", k)):
        _positive(field, v)
    if layout not in LAYOUTS:
        raise ValueError(f"layout {layout!r} is not one of {', '.join(LAYOUTS)}")
    epi = f",epi={join_epilogue(epilogue.split('+'))}" if epilogue else ""
    return f"matmul/m{m}n{n}k{k}/{layout}/{_types(dtype)}/alpha=1,beta={1 if residual else 0}{epi}"


def conv2d_key(n, h, w, c, k, r, s, pad=(0, 0), stride=(1, 1), dilation=(1, 1), dtype="f16", epilogue=None, residual=False):
    """The key of a forward convolution, NHWC input and KRSC filter, with its fused epilogue per
    output channel (`epilogue`: parts as `join_epilogue` spells them; `residual`: a tensor of the
    output's shape added before the bias and the activation)."""
    for field, v in (("n", n), ("h", h), ("w", w), ("c", c), ("k", k), ("r", r), ("s", s)):
        _positive(field, v)
    for field, pair in (("pad", pad), ("stride", stride), ("dilation", dilation)):
        if len(pair) != 2 or any(isinstance(v, bool) or not isinstance(v, int) for v in pair):
            raise ValueError(f"{field} must be two integers (height, width), got {pair!r}")
    if min(pad) < 0 or min(stride) < 1 or min(dilation) < 1:
        raise ValueError(f"pad must be >= 0 and stride, dilation >= 1; got pad {pad}, stride {stride}, dilation {dilation}")
    key = (
        f"conv2d/n{n}h{h}w{w}c{c}/k{k}r{r}s{s}/pad{pad[0]}x{pad[1]},stride{stride[0]}x{stride[1]},"
        f"dil{dilation[0]}x{dilation[1]}/nhwc/{_types(dtype)}"
    )
    fused = (["beta=1"] if residual else []) + ([f"epi={join_epilogue(epilogue.split('+'))}"] if epilogue else [])
    return f"{key}/{','.join(fused)}" if fused else key


def parse_key(key):
    """The fields of a key as a dict (`op` is `matmul` or `conv2d`); ValueError when it is not one."""
    m = _MATMUL.match(key)
    if m:
        g = m.groups()
        return {
            "op": "matmul",
            "m": int(g[0]),
            "n": int(g[1]),
            "k": int(g[2]),
            "layout": g[3],
            "types": (g[4], g[5], g[6]),
            "alpha": float(g[7]),
            "beta": float(g[8]),
            "scale": g[9],
            "residual": float(g[8]) != 0,
            "epilogue": g[10],
        }
    c = _CONV.match(key)
    if c:
        v = [int(x) for x in c.groups()[:13]]
        return {
            "op": "conv2d",
            "n": v[0],
            "h": v[1],
            "w": v[2],
            "c": v[3],
            "k": v[4],
            "r": v[5],
            "s": v[6],
            "pad": (v[7], v[8]),
            "stride": (v[9], v[10]),
            "dilation": (v[11], v[12]),
            "types": c.groups()[13:16],
            "residual": c.group(17) is not None,
            "epilogue": c.group(18),
        }
    raise ValueError(f"{key!r} is not a matmul or conv2d workload key")


def plain_key(key):
    """`key` without its fused epilogue: a matmul's `alpha=1,beta=0`, a conv's key without its
    last segment; the key of the op alone, which apply sees before what follows it."""
    f = parse_key(key)
    if f["op"] == "matmul":
        return key.rsplit("/", 1)[0] + "/alpha=1,beta=0"
    return key.rsplit("/", 1)[0] if key.count("/") == 6 else key


def matmul_layout(x_rows_contiguous, w_rows_contiguous):
    """The key's layout of the row-major product X @ W (X: rows x k, W: k x n).

    The key's op(A) is W^T (n x k): W with contiguous rows (n contiguous) is `n`, W with contiguous
    columns (a transposed view, k contiguous, as nn.Linear's weight is used) is `t`. The key's op(B)
    is X^T (k x rows): X with contiguous rows (k contiguous) is `n`, contiguous columns `t`.
    """
    return ("n" if w_rows_contiguous else "t") + ("n" if x_rows_contiguous else "t")


def join_epilogue(parts):
    """`bias+relu` from ["bias", "relu"]; None when empty. Unknown parts are refused."""
    for p in parts:
        if p not in EPILOGUE_PARTS:
            raise ValueError(f"epilogue part {p!r} is not one of {', '.join(EPILOGUE_PARTS)}")
    return "+".join(parts) if parts else None


class SuiteBuilder:
    """Distinct workloads in first-seen order, each with its occurrences.

    Two occurrences are the same entry when key, batch and epilogue agree.
    """

    #: Op names kept per entry: enough to find the layers.
    MAX_OPS = 6

    def __init__(self):
        self._entries = []
        self._at = {}
        self.skipped = []

    def add(self, key, op=None, batch=None, epilogue=None):
        parse_key(key)
        if batch is not None:
            _positive("batch", batch)
            if batch == 1:
                batch = None
        ident = (key, batch, epilogue)
        if ident not in self._at:
            entry = {"workload": key, "count": 0}
            if batch is not None:
                entry["batch"] = batch
            if epilogue:
                entry["epilogue"] = epilogue
            entry["ops"] = []
            self._at[ident] = len(self._entries)
            self._entries.append(entry)
        entry = self._entries[self._at[ident]]
        entry["count"] += 1
        if op and len(entry["ops"]) < self.MAX_OPS:
            entry["ops"].append(op)
        return entry

    def skip(self, what):
        """Notes an op that is not tuned (grouped conv, a non-contiguous operand, ...)."""
        self.skipped.append(what)

    def entries(self):
        return [dict(e, ops=list(e["ops"])) if e["ops"] else {k: v for k, v in e.items() if k != "ops"} for e in self._entries]

    def suite(self, name, description=""):
        if not self._entries:
            raise ValueError("the suite has no workloads: the model ran no matmul, linear or conv2d op")
        return {"name": name, "description": description, "workloads": self.entries()}


def write_suite(suite, path):
    """Writes a suite dict as the CLI reads it."""
    with open(path, "w") as f:
        json.dump(suite, f, indent=2)
        f.write("\n")


def read_suite(path):
    """Reads and checks a suite file (every key parses, counts positive)."""
    with open(path) as f:
        suite = json.load(f)
    if not isinstance(suite, dict) or not isinstance(suite.get("workloads"), list) or not suite["workloads"]:
        raise ValueError(f"{path}: not a suite file (it needs a non-empty 'workloads' list)")
    for i, e in enumerate(suite["workloads"]):
        try:
            parse_key(e["workload"])
            for field in ("count", "batch"):
                if field in e:
                    _positive(field, e[field])
        except (KeyError, ValueError) as err:
            raise ValueError(f"{path}: workloads[{i}]: {err}") from None
    return suite
