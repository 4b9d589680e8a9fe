"""Stand-in for SGLang's HTTP server, for tests, benchmarks and the demo only.

This package is a test double of SGLang's HTTP contract (/work/shared/docs/sglang-contract.md):
same launch flags, endpoints, error texts and envelopes, a deterministic text generator and a
CPU-cheap batching performance model. It is never a replacement for a real SGLang server, and
production code must not import it.

Entry points: `python -m sglang_standin` (the server), `sglang_standin.process.start_standin`
(spawn one from Python), `sglang_standin.tokenizer.build_chat_tokenizer` (a local tokenizer
directory to serve), `sglang_standin.perf.ceiling_gen_throughput` (the modelled ceiling).
"""
