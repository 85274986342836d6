"""RoPE as llama.cpp computes it, reduced to what every path reads: per rotation pair i, the angle one
position turns it by (`freqs[i]`, float64), and one factor on cos and sin (`mscale`).

llama.cpp (ggml's rope_yarn; llama-context.cpp for the factors) turns pair i of position p by
  theta_extrap = p * base^(-2i/n_dims) / ff[i]            ff: rope_freqs.weight (Llama 3.1+), else 1
  theta_interp = freq_scale * theta_extrap                freq_scale = 1 / rope.scaling.factor
  theta        = theta_interp                             none (freq_scale 1) and linear
  theta        = theta_interp (1 - mix_i) + theta_extrap mix_i    YaRN: mix_i = ext_factor * ramp(i),
                 ramp 1 below the correction dims, 0 above them, linear between
and multiplies cos and sin by mscale = attn_factor (YaRN: times 1 + 0.1 ln(1 / freq_scale)).
Every case is linear in p, so freqs[i] = base^(-2i/n_dims) / ff[i] * (freq_scale (1 - mix_i) + mix_i),
computed here once in float64 and read alike by the reference, every kernel and the trace.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..errors import ModelError

F32 = np.float32
SCALING_KINDS = ("none", "linear", "yarn", "longrope")  # longrope: factor tensors (phi3), no ramp


@dataclass(frozen=True)
class RopeScaling:
    """A layer kind's RoPE scaling, as llama.cpp's cparams hold it once a file is loaded."""

    kind: str = "none"  # "none", "linear", "yarn" or "longrope"
    freq_scale: float = 1.0  # 1 / rope.scaling.factor
    ext_factor: float = 0.0  # YaRN's extrapolation mix (1 for yarn, llama.cpp's default)
    attn_factor: float = 1.0  # llama.cpp's yarn_attn_factor: its YaRN corrections, times rope.scaling.attn_factor
    n_ctx_orig: int = 0  # rope.scaling.original_context_length (else the training context)
    beta_fast: float = 32.0  # YaRN's correction range, in rotations over n_ctx_orig (llama.cpp's defaults)
    beta_slow: float = 1.0

    @property
    def mscale(self) -> float:
        """The factor on cos and sin (float32, as the kernels take it)."""
        m = F32(self.attn_factor)
        if self.ext_factor:
            m = F32(m * F32(1.0 + 0.1 * math.log(1.0 / self.freq_scale)))
        return float(m)

    def describe(self) -> str:
        """One line for `sharpinf info`."""
        if self.kind == "yarn":
            return (f"YaRN x{1 / self.freq_scale:g} over an original context of {self.n_ctx_orig} "
                    f"(cos and sin x{self.mscale:.4f})")
        text = {"none": "unscaled", "longrope": "LongRoPE"}.get(self.kind, f"linear x{1 / self.freq_scale:g}")
        return text + (f" (cos and sin x{self.mscale:.4f})" if self.mscale != 1.0 else "")


def yarn_attn_factor(freq_scale: float, attn_factor: float = 1.0, log_mul: float = 0.0) -> float:
    """llama.cpp's cparams.yarn_attn_factor for YaRN (llama-context.cpp): get_mscale(factor, 1), divided by
    get_mscale(factor, log_mul) when the file gives a log multiplier, then divided by the 1 + 0.1 ln(factor)
    that the rope kernel multiplies back, then times rope.scaling.attn_factor."""
    factor = 1.0 / freq_scale

    def get_mscale(scale: float, m: float) -> float:
        return 1.0 if scale <= 1.0 else 0.1 * m * math.log(scale) + 1.0

    a = get_mscale(factor, 1.0) / get_mscale(factor, log_mul) if log_mul else get_mscale(factor, 1.0)
    return a / (1.0 + 0.1 * math.log(factor)) * attn_factor


def yarn_corr_dims(n_dims: int, n_ctx_orig: int, base: float, beta_fast: float, beta_slow: float) -> tuple[float, float]:
    """ggml_rope_yarn_corr_dims, in float32 as ggml forms it: the pairs whose wavelength fits beta_fast
    and beta_slow rotations into n_ctx_orig, floored and ceiled, clamped to [0, n_dims - 1]."""
    def corr(n_rot: float) -> F32:
        return F32(n_dims) * F32(np.log(F32(n_ctx_orig) / (F32(n_rot) * F32(2 * np.pi)))) / (F32(2) * F32(np.log(F32(base))))
    return float(max(F32(0), np.floor(corr(beta_fast)))), float(min(F32(n_dims - 1), np.ceil(corr(beta_slow))))


def rope_freqs(base: float, n_dims: int, scaling: RopeScaling = RopeScaling(),
               factors: np.ndarray | None = None) -> np.ndarray:
    """float64 [n_dims / 2]: the angle one position turns pair i by (the module docstring's formula)."""
    i = np.arange(n_dims // 2, dtype=np.float64)
    f = float(base) ** (-2.0 * i / n_dims)
    if factors is not None:
        f = f / np.asarray(factors, dtype=np.float64).reshape(-1)[: n_dims // 2]
    fs = float(F32(scaling.freq_scale))
    if not scaling.ext_factor:
        return f * fs
    low, high = yarn_corr_dims(n_dims, scaling.n_ctx_orig, base, scaling.beta_fast, scaling.beta_slow)
    ramp = 1.0 - np.clip((i - low) / max(0.001, high - low), 0.0, 1.0)
    mix = ramp * float(F32(scaling.ext_factor))
    return f * (fs * (1.0 - mix) + mix)


@dataclass(frozen=True, eq=False)
class RopeTable:
    """One layer's RoPE, as every path takes it: angle per position of each pair, factor on cos and sin."""

    freqs: np.ndarray  # float64 [head_dim / 2]
    mscale: float = 1.0

    @classmethod
    def plain(cls, base: float, head_dim: int, freq_scale: float = 1.0) -> "RopeTable":
        """Unscaled (or linearly scaled) RoPE of base `base`: what tests and benches build by hand."""
        kind = "linear" if freq_scale != 1.0 else "none"
        return cls(rope_freqs(base, head_dim, RopeScaling(kind, freq_scale)))


def layer_tables(cfg, factors: np.ndarray | None) -> list[RopeTable]:
    """Each layer's table; layers of one kind share one object (so one device copy each). A layer
    without RoPE (smollm3's NoPE layers) turns by 0 with cos and sin unscaled: cos 1 and sin 0 exactly,
    so every path leaves Q and K as they are."""
    made: dict[tuple, RopeTable] = {}
    out = []
    for li in range(cfg.n_layer):
        base, scaling = cfg.rope_for(li)
        key = (base, scaling) if cfg.uses_rope(li) else None
        if key not in made:
            made[key] = (RopeTable(rope_freqs(base, cfg.head_dim, scaling, factors), scaling.mscale) if key else
                         RopeTable(np.zeros(cfg.head_dim // 2), 1.0))
        out.append(made[key])
    return out


def model_rope_tables(model) -> list[RopeTable]:
    """A LoadedModel's per-layer tables, its frequency factors applied where the file has them:
    rope_freqs.weight (Llama 3.1+), or LongRoPE's long or short ones as the run's context picks."""
    cfg = model.config
    name = f"rope_factors_{cfg.longrope_factors()}.weight" if cfg.has_longrope else "rope_freqs.weight"
    t = model.tensors.get(name)
    return layer_tables(cfg, None if t is None else t.dequantize().astype(np.float32).reshape(-1))


def read_rope_scaling(path, meta: dict, arch: str, n_ctx_train: int, _get) -> RopeScaling:
    """RoPE scaling as llama.cpp loads it (llama-model.cpp's load_hparams, llama-context.cpp; _get: the
    loader's typed key reader): the
    type (default linear), freq_scale = 1 / rope.scaling.factor (or the older rope.scale_linear),
    rope.scaling.attn_factor on cos and sin; YaRN adds ext_factor 1, the original context
    (rope.scaling.original_context_length, else the training context) and its attention factor."""
    kind = _get(path, meta, f"{arch}.rope.scaling.type", str, "linear")
    factor = _get(path, meta, f"{arch}.rope.scaling.factor", float, 0.0) or _get(
        path, meta, f"{arch}.rope.scale_linear", float, 0.0)
    attn = _get(path, meta, f"{arch}.rope.scaling.attn_factor", float, 1.0)
    if kind not in SCALING_KINDS:
        raise ModelError(path, f"unsupported RoPE scaling {kind!r} (supported: {', '.join(SCALING_KINDS)})")
    if factor < 0 or attn <= 0:
        raise ModelError(path, f"bad metadata: rope.scaling.factor = {factor}, rope.scaling.attn_factor = {attn}")
    freq_scale = 1.0 if kind == "none" or not factor else 1.0 / factor
    if kind == "longrope":  # llama.cpp: no ramp (ext_factor 0); the factor tensors do the rest (model_rope_tables)
        return RopeScaling("longrope", freq_scale, attn_factor=attn)
    if kind != "yarn":
        return RopeScaling("none" if freq_scale == 1.0 else "linear", freq_scale, attn_factor=attn)
    n_orig = _get(path, meta, f"{arch}.rope.scaling.original_context_length", int, 0) or n_ctx_train
    if n_orig <= 0:
        raise ModelError(path, f"bad metadata: rope.scaling.original_context_length = {n_orig}")
    # mistral3's files may set YaRN's betas and its log multiplier (keys.py refuses them in another arch)
    beta_fast = _get(path, meta, f"{arch}.rope.scaling.yarn_beta_fast", float, 32.0)
    beta_slow = _get(path, meta, f"{arch}.rope.scaling.yarn_beta_slow", float, 1.0)
    log_mul = _get(path, meta, f"{arch}.rope.scaling.yarn_log_multiplier", float, 0.0)
    if beta_fast <= 0 or beta_slow <= 0:
        raise ModelError(path, f"bad metadata: rope.scaling.yarn_beta_fast = {beta_fast}, yarn_beta_slow = {beta_slow}")
    # llama.cpp's yarn_attn_factor: exactly 1 when the factor is 1 (get_mscale of a scale <= 1), times attn
    return RopeScaling("yarn", freq_scale, ext_factor=1.0, attn_factor=yarn_attn_factor(freq_scale, attn, log_mul),
                       n_ctx_orig=n_orig, beta_fast=beta_fast, beta_slow=beta_slow)
