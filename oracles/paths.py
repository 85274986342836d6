"""The oracles of the packed, paged forward pass (sharpinf verify and the tests use these).

(a) kernel-vs-reference        teacher-forced logits at every position vs the NumPy reference
(b) packed-vs-sequential       S >= 2 prompts prefilled in one step vs each alone: bit-identical
(c) chunked-vs-whole           one prompt prefilled in random chunks vs one chunk: bit-identical
(d) batched-decode-vs-single   sequences at different positions decoded together vs each alone: bit-identical
(e) placement                  the same sequence in other, shuffled physical blocks: bit-identical
(b)-(e) are exact because every kernel's arithmetic for a token depends only on that token, its
position and its own sequence's K/V -- never on what else is in the step, where the K/V lives or
how the step was padded (batch invariance, a design rule of every kernel and variant).
and graph-vs-eager (oracles/graph_oracle.py): steps replayed from CUDA graphs, padded to their
buckets, vs launched eagerly at their exact shapes: bit-identical logits and sampled ids.

Every run NaN-poisons the KV pool first, so a read of a slot nobody wrote shows as NaN.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from oracles.compare import OracleResult, compare_logits, exact
from oracles.graph_oracle import oracle_graph_vs_eager, standard_schedule
from oracles.paged_runner import PagedRunner
from oracles.reference import Reference
from oracles.tolerances import ROUTE_FLIP_GAP, kernel_vs_reference
from sharpinf.step.forward import ForwardPass
from sharpinf.step.kv_pool import KVPool


_last_reference: list[Reference] = []


def reference_for(model, kv_dtype: str, act_quant: str = "f32", moe_act_quant: str | None = None) -> Reference:
    """The reference of `model` with KV stored as kv_dtype and matmul inputs rounded as
    act_quant ("q8_1" for the dp4a kernels; an MoE layer's as moe_act_quant, default the same);
    weights dequantized once per model."""
    if not _last_reference or _last_reference[0].model is not model:
        _last_reference[:] = [Reference(model)]
    ref = _last_reference[0]
    ref.kv_dtype, ref.act_quant, ref.moe_act_quant = kv_dtype, act_quant, moe_act_quant
    return ref


def act_quant_of(fp: ForwardPass) -> str:
    """How fp's matmuls read activations: the reference rounds them the same way."""
    return "q8_1" if fp.choice.q8_activations else "f32"


def moe_act_quant_of(fp: ForwardPass) -> str | None:
    """How fp's MoE layers read their input (the moe variant's activations), or None for a dense model."""
    return fp.choice.of("moe").activations if fp.cfg.is_moe else None


def fresh_runner(fp: ForwardPass, kv_dtype: str, num_blocks: int, block_size: int, seed: int) -> PagedRunner:
    pool = KVPool(fp.backend, fp.cfg, num_blocks=num_blocks, block_size=block_size, kv_dtype=kv_dtype)
    pool.poison()
    return PagedRunner(fp, pool, seed=seed)


def blocks_for(lengths: list[int], block_size: int, spare: int = 3) -> int:
    return sum(-(-n // block_size) for n in lengths) + spare


def oracle_kernel_vs_reference(fp, tokens, kv_dtype="f16", block_size=16, seed=0) -> OracleResult:
    """The reference stores K/V rounded as the kv_dtype cache does, and rounds matmul inputs to
    q8_1 when the kernels read them so, so the bound stays tight."""
    run = fresh_runner(fp, kv_dtype, blocks_for([len(tokens)], block_size), block_size, seed)
    got = run.prefill_chunks(list(tokens), [len(tokens)])
    act, moe_act = act_quant_of(fp), moe_act_quant_of(fp)
    ref = reference_for(fp.model, kv_dtype, act, moe_act)
    if fp.cfg.is_moe:  # the step's routing, every layer (the one step ran the whole prompt): near ties explained
        n = len(tokens) * fp.cfg.n_expert_used
        ids = fp.backend.download(fp.ws.moe.ids)[:, :n].reshape(fp.cfg.n_layer, len(tokens), -1)
        ref.routes, ref.route_gap, ref.route_flips = dict(enumerate(ids)), ROUTE_FLIP_GAP, 0
    try:
        want = ref.logits(list(tokens))
    finally:
        flips, ref.routes = ref.route_flips, None
    bound_act = "q8_1" if "q8_1" in (act, moe_act) else act  # the bound of q8_1 inputs if any layer reads them
    tol = kernel_vs_reference(kv_dtype, float(np.abs(want).max()) / 10.0, bound_act, fp.cfg.n_layer,
                              fp.choice.of("attention").rounding)
    r = compare_logits("kernel-vs-reference", f"{len(tokens)} tokens, KV {kv_dtype}, kernels {fp.choice.name}",
                       got, want, tol)
    if flips:
        note = f"{flips} near-tie routing flip(s) followed (router-logit gap < {ROUTE_FLIP_GAP})"
        r = replace(r, detail=f"{r.detail}; {note}" if r.detail else note)
    return r


def oracle_packed_vs_sequential(fp, prompts, kv_dtype="f16", block_size=16, seed=0) -> OracleResult:
    lens = [len(p) for p in prompts]
    alone = []
    for p in prompts:
        run = fresh_runner(fp, kv_dtype, blocks_for([len(p)], block_size), block_size, seed)
        alone.append(run.prefill_chunks(list(p), [len(p)]))
    run = fresh_runner(fp, kv_dtype, blocks_for(lens, block_size), block_size, seed + 1)
    packed = run.step([(run.new_seq(), list(p)) for p in prompts], all_logits=True)
    return exact("packed-vs-sequential", f"S={len(prompts)} lengths {lens}, KV {kv_dtype}",
                 np.concatenate(packed), np.concatenate(alone))


def random_chunks(n: int, rng: np.random.Generator, max_chunk: int | None = None) -> list[int]:
    sizes, left = [], n
    while left:
        c = int(rng.integers(1, min(left, max_chunk or left) + 1))
        sizes.append(c)
        left -= c
    return sizes


def oracle_chunked_vs_whole(fp, tokens, kv_dtype="f16", block_size=16, seed=0, chunks=None) -> OracleResult:
    rng = np.random.default_rng(seed)
    chunks = chunks or random_chunks(len(tokens), rng, max_chunk=max(1, len(tokens) // 2))
    nb = blocks_for([len(tokens)], block_size)
    whole = fresh_runner(fp, kv_dtype, nb, block_size, seed).prefill_chunks(list(tokens), [len(tokens)])
    chunked = fresh_runner(fp, kv_dtype, nb, block_size, seed + 1).prefill_chunks(list(tokens), chunks)
    return exact("chunked-vs-whole", f"{len(tokens)} tokens in chunks {chunks}, KV {kv_dtype}", chunked, whole)


def oracle_batched_decode(fp, prompts, decode_tokens, kv_dtype="f16", block_size=16, seed=0) -> OracleResult:
    """prompts[i] prefilled alone-or-together, then decode_tokens[i][k] fed at step k (teacher-forced)."""
    steps = len(decode_tokens[0])
    lens = [len(p) + steps for p in prompts]
    alone = []
    for p, dec in zip(prompts, decode_tokens):
        run = fresh_runner(fp, kv_dtype, blocks_for([len(p) + steps], block_size), block_size, seed)
        sid = run.new_seq()
        run.step([(sid, list(p))])
        alone.append(np.concatenate([run.step([(sid, [t])])[0] for t in dec]))
    run = fresh_runner(fp, kv_dtype, blocks_for(lens, block_size), block_size, seed + 1)
    sids = [run.new_seq() for _ in prompts]
    for sid, p in zip(sids, prompts):  # prefill each alone, then decode all together
        run.step([(sid, list(p))])
    rows = [run.step([(sid, [dec[k]]) for sid, dec in zip(sids, decode_tokens)]) for k in range(steps)]
    together = [np.concatenate([rows[k][i] for k in range(steps)]) for i in range(len(prompts))]
    return exact("batched-decode-vs-single-user",
                 f"{len(prompts)} seqs at positions {[len(p) for p in prompts]}, {steps} steps, KV {kv_dtype}",
                 np.concatenate(together), np.concatenate(alone))


def oracle_placement(fp, tokens, kv_dtype="f16", block_size=16, seed=0) -> OracleResult:
    nb = blocks_for([len(tokens)], block_size, spare=2 * -(-len(tokens) // block_size) + 3)
    a = fresh_runner(fp, kv_dtype, nb, block_size, seed).prefill_chunks(list(tokens), [len(tokens)])
    b = fresh_runner(fp, kv_dtype, nb, block_size, seed + 7919).prefill_chunks(list(tokens), [len(tokens)])
    return exact("placement", f"{len(tokens)} tokens, shuffled blocks, KV {kv_dtype}", a, b)


def verify_prompts(cfg, tokenizer=None, rng: np.random.Generator | None = None,
                   past_window: bool = True) -> tuple[list[list[int]], list[int]]:
    """The prompts of verify's oracles (text through the tokenizer, else seeded ids) and the long
    one kernel-vs-reference runs (oracles/trace.py traces it too). With sliding-window layers the
    long prompt runs past the smallest window, unless past_window is False (verify --quick)."""
    rng = np.random.default_rng(0) if rng is None else rng
    if tokenizer is not None:
        texts = ["The capital of France is", "def fibonacci(n):\n    if n < 2:\n        return n",
                 "Once upon a time, in a small village by the sea, there lived an old fisherman who"]
        prompts = [tokenizer.encode(t) for t in texts]
        if tokenizer.chat_template:  # a base model (Gemma 3 270M) has none
            prompts.append(tokenizer.apply_chat([{"role": "user", "content": "Name three primary colours."}]))
    else:
        prompts = [rng.integers(0, cfg.n_vocab, n).tolist() for n in (5, 17, 33, 41)]
    longest = max(prompts, key=len)
    windows = [w for w in cfg.layer_window if w]
    if windows and past_window:  # sliding-window layers: the long prompt runs past the smallest window
        body = [t for p in prompts for t in p[1:]] or [1]
        longest = longest[:1] + (body * (min(windows) // len(body) + 2))[: min(windows) + 40]
    return prompts, longest


def path_cases(fp, tokenizer=None, kv_dtypes=("f16", "q8_0"), seed=0, past_window: bool = True):
    """The five oracles and graph-vs-eager on a short prompt set for `sharpinf verify` (real or
    synthetic model), in fp's kernel variants (each label names them). With sliding-window layers
    the long prompt runs past the smallest window, unless past_window is False (verify --quick)."""
    from oracles.foundation import OracleCase

    rng = np.random.default_rng(seed)
    prompts, longest = verify_prompts(fp.cfg, tokenizer, rng, past_window)
    decode = [rng.integers(0, fp.cfg.n_vocab, 4).tolist() for _ in prompts[:3]]
    cases = []
    for kv in kv_dtypes:
        if kv == "q8_0" and fp.cfg.head_dim % 32:
            continue
        cases.append(OracleCase("kernel-vs-reference", f"{len(longest)} tokens, KV {kv}",
                                lambda kv=kv: oracle_kernel_vs_reference(fp, longest, kv_dtype=kv)))
    kv = kv_dtypes[0]
    cases += [
        OracleCase("packed-vs-sequential", f"S={len(prompts)}",
                   lambda: oracle_packed_vs_sequential(fp, prompts, kv_dtype=kv)),
        OracleCase("chunked-vs-whole", f"{len(longest)} tokens",
                   lambda: oracle_chunked_vs_whole(fp, longest, kv_dtype=kv, seed=seed)),
        OracleCase("batched-decode-vs-single-user", f"{len(decode)} seqs",
                   lambda: oracle_batched_decode(fp, prompts[:3], decode, kv_dtype=kv)),
        OracleCase("placement", f"{len(longest)} tokens", lambda: oracle_placement(fp, longest, kv_dtype=kv)),
        OracleCase("graph-vs-eager", "prefill, chunked, decode, mixed steps",
                   lambda: oracle_graph_vs_eager(fp, standard_schedule(fp.cfg.n_vocab, seed), kv_dtype=kv)),
    ]
    return [_naming_kernels(c, fp.choice.name) for c in cases]


def _naming_kernels(c, kernels: str):
    """The case, its label and its result's label saying which kernel variants ran."""
    from dataclasses import replace

    from oracles.foundation import OracleCase

    tag = f", kernels {kernels}"

    def run():
        r = c.run()
        return r if r.case.endswith(tag) else replace(r, case=r.case + tag)

    return OracleCase(c.oracle, c.case + tag, run)
