"""The server's Prometheus metrics (prometheus-client), in a registry of its own.

Counters and histograms are fed by the handlers (a request's outcome, its time to first token,
the gaps between its tokens); the engine's state (running and waiting sequences, KV usage,
prefix-cache hit rate, tokens/s; with speculative decoding its acceptance rate, mean accepted
length and target passes per token) is read when /metrics is scraped, and so are its counts
(preemptions, tokens computed, guesses verified and kept), each added to a counter by what it grew
since the last scrape.
"""

from __future__ import annotations

import threading
from typing import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
OUTCOMES = ("ok", "bad_request", "aborted", "error", "cut")


class ServerMetrics:
    def __init__(self, engine_state: Callable[[], dict | None]):
        self.registry = r = CollectorRegistry()
        self.requests = Counter("sharpinf_requests", "Requests by outcome: ok, bad_request (4xx), aborted "
                                "(client gone), error, cut (still running at shutdown's bound)", ["outcome"], registry=r)
        for o in OUTCOMES:
            self.requests.labels(o)
        self.ttft = Histogram("sharpinf_time_to_first_token_seconds", "Request receipt to its first token",
                              buckets=LATENCY_BUCKETS, registry=r)
        self.itl = Histogram("sharpinf_inter_token_latency_seconds", "Time between a request's tokens",
                             buckets=LATENCY_BUCKETS, registry=r)
        self.prompt_tokens = Counter("sharpinf_prompt_tokens", "Prompt tokens of accepted requests", registry=r)
        self.generation_tokens = Counter("sharpinf_generation_tokens", "Tokens generated", registry=r)
        self.preemptions = Counter("sharpinf_preemptions", "Sequences preempted (their KV recomputed later)",
                                   registry=r)
        self.tokens_computed = Counter("sharpinf_tokens_computed", "Tokens the forward pass computed: prompt tokens "
                                       "the prefix cache did not serve, fed tokens, recomputation after a preemption",
                                       registry=r)
        # speculative decoding (zero when off): guesses verified, kept, and the verifications (vLLM's
        # spec_decode counters); the rates as gauges
        self.spec = {key: Counter(f"sharpinf_spec_decode_{name}", doc, registry=r) for key, name, doc in (
            ("draft_tokens", "draft_tokens", "Speculative guesses verified by the target"),
            ("accepted_tokens", "accepted_tokens", "Speculative guesses kept (each equals the target's own pick)"),
            ("verify_chunks", "verifications", "Chunks that verified at least one guess"))}
        for key, name, doc in (
                ("acceptance_rate", "acceptance_rate", "Share of verified guesses kept"),
                ("mean_accepted_length", "mean_accepted_length", "Tokens a verification gives out (kept guesses + "
                                                                 "the target's pick)"),
                ("target_passes_per_token", "target_passes_per_token", "Target chunks that sampled per output token "
                                                                       "(1 without speculation)")):
            Gauge(f"sharpinf_spec_decode_{name}", doc, registry=r).set_function(lambda key=key: self._read_spec(key))
        self._seen = {"preemptions": 0, "tokens_computed": 0, "draft_tokens": 0, "accepted_tokens": 0,
                      "verify_chunks": 0}  # the engine's counts already added to the counters
        self._lock = threading.Lock()  # two scrapes at once add each delta once
        self._state = engine_state
        gauges = {
            "running_sequences": ("running", "Sequences in the running batch"),
            "waiting_sequences": ("waiting", "Sequences waiting for admission"),
            "kv_cache_usage_ratio": ("kv_usage", "Share of KV blocks in use"),
            "prefix_cache_hit_rate": ("prefix_cache_hit_rate", "Share of prompt blocks found in the prefix cache"),
            "throughput_tokens_per_second": ("throughput_tok_per_s", "Tokens generated per second since start"),
        }
        for name, (key, doc) in gauges.items():
            Gauge(f"sharpinf_{name}", doc, registry=r).set_function(lambda key=key: self._read(key))

    def _read(self, key: str) -> float:
        state = self._state()
        v = (state or {}).get(key)
        return float(v) if isinstance(v, (int, float)) else 0.0

    def _read_spec(self, key: str) -> float:
        v = ((self._state() or {}).get("speculative") or {}).get(key)
        return float(v) if isinstance(v, (int, float)) else 0.0

    def exposition(self) -> bytes:
        with self._lock:
            counts = [(k, c, self._read) for k, c in (("preemptions", self.preemptions),
                                                      ("tokens_computed", self.tokens_computed))]
            counts += [(k, c, self._read_spec) for k, c in self.spec.items()]
            for key, counter, read in counts:
                n = int(read(key))
                if n > self._seen[key]:
                    counter.inc(n - self._seen[key])
                    self._seen[key] = n
        return generate_latest(self.registry)
