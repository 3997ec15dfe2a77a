"""A tensortune bundle's manifest, and which workloads a model should run from it (no torch).

`tensortune export` writes `manifest.json` (format 1): per kernel its workload key, the problem it
computes, launch geometry, parameters, cubins per architecture, its time and the vendor library's
in the same session, and `winner` (`ours` or `vendor`; older bundles: read from the two times).
`Plan.decide(key)` says whether a model should launch the bundle's kernel for a workload: only
where ours won, the bundle has a cubin for this GPU, and the kernel computes exactly that problem;
otherwise PyTorch keeps its own op, so an applied model is never knowingly slower than the vendor.
"""

import json
import os

from .suite import parse_key, plain_key

FORMAT = 1


def winner(entry):
    """`ours` or `vendor` for a manifest entry (dict)."""
    w = entry.get("winner")
    if w in ("ours", "vendor"):
        return w
    vendor = entry.get("vendor_us")
    if vendor is not None and vendor > 0 and vendor <= entry.get("time_us", float("inf")):
        return "vendor"
    return "ours"


def cubin_for(entry, arch):
    """The cubin file name for compute capability `arch` (e.g. 90): sm_90a first, then sm_90."""
    cubins = entry.get("cubins") or {}
    return cubins.get(f"sm_{arch}a") or cubins.get(f"sm_{arch}")


class Plan:
    """The bundle's kernels by workload key, and the decision per key."""

    def __init__(self, manifest, directory=".", arch=None):
        if manifest.get("format") != FORMAT:
            raise ValueError(f"bundle manifest format {manifest.get('format')!r} is not supported (this reads {FORMAT})")
        self.directory = directory
        self.arch = arch
        self.entries = {}
        for e in manifest.get("kernels", []):
            key = e["workload_key"]
            # Several device classes may have a kernel for the same key: keep the fastest.
            if key not in self.entries or e["time_us"] < self.entries[key]["time_us"]:
                self.entries[key] = e
        # Plain keys (a conv's, a linear layer's) with a fused kernel that won: a model's op of
        # that shape is worth running lazily, to see whether what follows it (bias, batch norm,
        # add, activation) matches one.
        fused = []
        for k, e in self.entries.items():
            try:
                plain = plain_key(k)
            except ValueError:
                continue  # a key this reader cannot spell is never a model's
            if plain != k:
                fused.append((plain, winner(e)))
        self._fused = {k for k, w in fused if w == "ours"}
        self._lost = {k for k, w in fused if w != "ours"} - self._fused

    @classmethod
    def load(cls, directory, arch=None):
        path = os.path.join(directory, "manifest.json")
        try:
            with open(path) as f:
                manifest = json.load(f)
        except FileNotFoundError:
            raise FileNotFoundError(f"{path} does not exist: is {directory!r} a bundle (tensortune export -o DIR)?") from None
        return cls(manifest, directory, arch)

    def decide(self, key, epilogue=(), any_winner=False):
        """(entry, None) when the model should launch the bundle's kernel for `key` followed by
        `epilogue` (the call's own parts: `bias`), else (None, why PyTorch keeps its op). With
        `any_winner`, a kernel the vendor beat is returned too (for the caller to time in place)."""
        e = self.entries.get(key)
        if e is None and key in self._lost:
            return None, "the vendor won each fused kernel of this layer"
        if e is None:
            return None, "not tuned (no kernel in the bundle)"
        fields = parse_key(key)
        if "bias" in epilogue and "bias" not in (e.get("epilogue") or fields.get("epilogue") or ""):
            # PyTorch adds a bias inside its GEMM (cuBLASLt's epilogue); ours would need another
            # pass over the output, which the vendor time in the bundle does not count.
            return None, "a bias PyTorch fuses and this kernel does not"
        if winner(e) != "ours" and not any_winner:
            return None, f"the vendor won ({e.get('vendor_us', 0):.2f} us vs ours {e['time_us']:.2f} us)"
        if self.arch is not None and cubin_for(e, self.arch) is None:
            have = ", ".join(sorted(e.get("cubins") or {})) or "none"
            return None, f"no cubin for sm_{self.arch} (the bundle has {have})"
        beta = 1 if fields.get("residual") else 0
        if e["problem"].get("op") == "matmul" and (e["problem"].get("alpha") != 1 or e["problem"].get("beta") != beta):
            return None, "the kernel scales by alpha/beta"
        return e, None

    def fuses(self, plain):
        """Whether the bundle has a fused kernel that won for some epilogue of the plain conv or
        matmul key `plain`."""
        return plain in self._fused

    def chains(self, plain):
        """Whether the bundle has a fused kernel, won or lost, for some epilogue of `plain`: the op
        is worth running as a chain (where every one lost, as the vendor's fused call)."""
        return plain in self._fused or plain in self._lost

    def summary(self, keys):
        """How many of `keys` run ours, and why the others do not (reason -> count)."""
        ours, why = 0, {}
        for k in keys:
            e, reason = self.decide(*k) if isinstance(k, tuple) else self.decide(k)
            if e is not None:
                ours += 1
            else:
                why[reason.split(" (")[0]] = why.get(reason.split(" (")[0], 0) + 1
        return ours, why
