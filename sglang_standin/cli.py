"""Parse `python -m sglang_standin` arguments: SGLang's launch flags plus `--standin-*` ones.

The stand-in accepts the same command line as `python -m sglang.launch_server`, so one
launch-command builder serves both; SGLang flags it does not model are accepted, logged and
ignored. Flags starting with `--standin-` exist only here. `--config FILE.yaml` works as in
SGLang (`ConfigArgumentMerger`): the file's keys are long option names (`api-key: KEY`), its
values go before the command line's, so a flag given on the command line wins.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from sglang_standin import perf, speculative

SglangVersion = Literal["v0.5.23", "v0.5.6"]
VERSIONS: tuple[str, ...] = ("v0.5.23", "v0.5.6")
DEFAULT_VERSION: SglangVersion = "v0.5.23"
DEFAULT_CONTEXT_LENGTH = 32768
DEFAULT_PORT = 30000


@dataclass
class ServerConfig:
    """Hold every setting of one stand-in server; `from_args` builds it from a command line."""

    model_path: str
    tokenizer_path: str | None = None
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    context_length: int | None = None
    tp_size: int = 1
    mem_fraction_static: float | None = None
    served_model_name: str | None = None
    api_key: str | None = None
    log_level: str = "info"
    chat_template: str | None = None
    reasoning_parser: str | None = None
    enable_metrics: bool = False
    max_running_requests: int | None = None
    max_queued_requests: int | None = None
    enable_cache_report: bool = False
    disable_radix_cache: bool = False
    # Stand-in only.
    seed: int = 0
    warmup_seconds: float = 0.5
    default_context_length: int = DEFAULT_CONTEXT_LENGTH
    version: SglangVersion = DEFAULT_VERSION
    length_check: SglangVersion | None = None
    time_scale: float = 1.0
    decode_base_ms: float = perf.DEFAULT_DECODE_BASE_S * 1000
    decode_per_req_ms: float = perf.DEFAULT_DECODE_PER_REQ_S * 1000
    prefill_per_token_us: float = perf.DEFAULT_PREFILL_PER_TOKEN_S * 1e6
    max_total_num_tokens: int = perf.DEFAULT_MAX_TOTAL_NUM_TOKENS
    median_output_tokens: float = 300.0
    output_sigma: float = 0.9
    max_output_tokens: int = 16384
    zero_latency: bool = False
    crash_after_requests: int | None = None
    crash_after_seconds: float | None = None
    hang_after_requests: int | None = None
    hang_rate: float = 0.0
    error_rate: float = 0.0
    drop_rate: float = 0.0
    slow_warmup_seconds: float = 0.0
    load_seconds: float = 0.0
    noncanonical_rate: float = 0.0
    tool_call_rate: float = 0.0
    sampled_log_dir: str | None = None
    # SGLang's --speculative-* flags as given, resolved by the server (speculative.py).
    speculative: dict[str, Any] = field(default_factory=dict)
    ignored_args: list[str] = field(default_factory=list)

    @property
    def effective_served_model_name(self) -> str:
        return self.served_model_name or self.model_path

    @property
    def effective_tokenizer_path(self) -> str:
        return self.tokenizer_path or self.model_path

    @property
    def effective_length_check(self) -> SglangVersion:
        return self.length_check or self.version

    @property
    def effective_max_running_requests(self) -> int:
        return self.max_running_requests or perf.DEFAULT_MAX_RUNNING_REQUESTS

    def perf_model(self) -> perf.PerfModel:
        """Return the performance model these settings describe."""
        return perf.PerfModel(
            decode_base_s=self.decode_base_ms / 1000,
            decode_per_req_s=self.decode_per_req_ms / 1000,
            prefill_per_token_s=self.prefill_per_token_us / 1e6,
            max_running_requests=self.effective_max_running_requests,
            max_total_num_tokens=self.max_total_num_tokens,
            time_scale=self.time_scale,
        )

    def resolve_context_length(self) -> int:
        """Return C: --context-length, else the model config's max_position_embeddings, else
        --standin-default-context-length (SGLang likewise falls back to the model config)."""
        if self.context_length is not None:
            return self.context_length
        config_path = Path(self.model_path) / "config.json"
        if config_path.is_file():
            try:
                value = json.loads(config_path.read_text()).get("max_position_embeddings")
            except ValueError:
                value = None
            if isinstance(value, int) and value > 0:
                return value
        return self.default_context_length

    def sglang_args(self, *, reveal_key: bool = False) -> dict[str, object]:
        """Return the SGLang-named arguments as `/get_server_info` reports them.

        The key is masked unless ``reveal_key``: the real server echoes it over HTTP, and a
        test double has no reason to spread secrets there (its start-up log line, like
        SGLang's, shows it).
        """
        data = asdict(self)
        out = {k: data[k] for k in _SGLANG_FIELDS}
        out["served_model_name"] = self.effective_served_model_name
        out["tokenizer_path"] = self.effective_tokenizer_path
        if not reveal_key and self.api_key is not None:
            out["api_key"] = "<redacted by stand-in>"
        return out

    def standin_args(self) -> dict[str, object]:
        """Return the stand-in-only settings, each prefixed `standin_`."""
        data = asdict(self)
        out = {f"standin_{k}": data[k] for k in data
               if k not in _SGLANG_FIELDS and k != "speculative"}
        out["standin_length_check"] = self.effective_length_check
        out["standin_max_running_requests"] = self.effective_max_running_requests
        return out


_SGLANG_FIELDS = (
    "model_path",
    "tokenizer_path",
    "host",
    "port",
    "context_length",
    "tp_size",
    "mem_fraction_static",
    "served_model_name",
    "api_key",
    "log_level",
    "chat_template",
    "reasoning_parser",
    "enable_metrics",
    "max_running_requests",
    "max_queued_requests",
    "enable_cache_report",
    "disable_radix_cache",
)


def _rate(text: str) -> float:
    value = float(text)
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"a rate must be in [0, 1], got {text}")
    return value


def build_parser() -> argparse.ArgumentParser:
    """Return the argument parser; abbreviations are off so SGLang flags never mis-match."""
    p = argparse.ArgumentParser(
        prog="python -m sglang_standin",
        description="Stand-in for SGLang's HTTP server, for tests, benchmarks and the demo only.",
        allow_abbrev=False,
    )
    g = p.add_argument_group("SGLang launch_server flags")
    g.add_argument("--model-path", required=True, help="local directory holding a tokenizer")
    g.add_argument("--tokenizer-path", default=None)
    g.add_argument("--host", default="127.0.0.1")
    g.add_argument("--port", type=int, default=DEFAULT_PORT)
    g.add_argument("--context-length", type=int, default=None)
    g.add_argument(
        "--tp-size", "--tp", "--tensor-parallel-size", dest="tp_size", type=int, default=1
    )
    g.add_argument("--mem-fraction-static", type=float, default=None)
    g.add_argument("--served-model-name", default=None)
    g.add_argument("--api-key", default=None)
    g.add_argument(
        "--log-level", default="info", choices=["debug", "info", "warning", "error", "critical"]
    )
    g.add_argument(
        "--chat-template",
        default=None,
        help="path of a Jinja chat template file (named built-ins are not modelled)",
    )
    g.add_argument("--reasoning-parser", default=None)
    g.add_argument("--enable-metrics", action="store_true")
    g.add_argument("--max-running-requests", type=int, default=None)
    g.add_argument("--max-queued-requests", type=int, default=None)
    g.add_argument("--enable-cache-report", action="store_true",
                   help="report prompt tokens served from the radix cache in usage")
    g.add_argument("--disable-radix-cache", action="store_true")

    speculative.add_flags(p)
    s = p.add_argument_group("stand-in only")
    s.add_argument("--standin-seed", type=int, default=0)
    s.add_argument(
        "--standin-warmup-seconds",
        type=float,
        default=0.5,
        help="time after the port opens until /health answers 200",
    )
    s.add_argument(
        "--standin-default-context-length",
        type=int,
        default=DEFAULT_CONTEXT_LENGTH,
        help="C when neither --context-length nor config.json gives one",
    )
    s.add_argument(
        "--standin-version",
        choices=VERSIONS,
        default=DEFAULT_VERSION,
        help="SGLang release whose behaviour to copy where releases differ",
    )
    s.add_argument(
        "--standin-length-check",
        choices=VERSIONS,
        default=None,
        help="v0.5.23 rejects P+M > C, v0.5.6 P+M >= C (default: --standin-version)",
    )
    s.add_argument(
        "--standin-time-scale",
        type=float,
        default=1.0,
        help="multiply every modelled duration (0.01 makes a run 100x faster)",
    )
    s.add_argument("--standin-decode-base-ms", type=float, default=perf.DEFAULT_DECODE_BASE_S * 1e3)
    s.add_argument(
        "--standin-decode-per-req-ms", type=float, default=perf.DEFAULT_DECODE_PER_REQ_S * 1e3
    )
    s.add_argument(
        "--standin-prefill-per-token-us", type=float, default=perf.DEFAULT_PREFILL_PER_TOKEN_S * 1e6
    )
    s.add_argument(
        "--standin-max-total-num-tokens",
        type=int,
        default=perf.DEFAULT_MAX_TOTAL_NUM_TOKENS,
        help="KV-cache capacity in tokens",
    )
    s.add_argument("--standin-median-output-tokens", type=float, default=300.0)
    s.add_argument(
        "--standin-output-sigma",
        type=float,
        default=0.9,
        help="sigma of the lognormal natural output length",
    )
    s.add_argument(
        "--standin-max-output-tokens",
        type=int,
        default=16384,
        help="longest natural output before any max_tokens cap",
    )
    s.add_argument(
        "--standin-zero-latency",
        action="store_true",
        help="answer at once, bypassing the performance model",
    )
    s.add_argument(
        "--standin-crash-after-requests",
        type=int,
        default=None,
        help="exit the process when generation request N+1 arrives",
    )
    s.add_argument(
        "--standin-crash-after-seconds",
        type=float,
        default=None,
        help="exit the process this long after the ready line",
    )
    s.add_argument(
        "--standin-hang-after-requests",
        type=int,
        default=None,
        help="after N generation requests, accept requests but never answer",
    )
    s.add_argument("--standin-hang-rate", type=_rate, default=0.0)
    s.add_argument("--standin-error-rate", type=_rate, default=0.0, help="HTTP 500 at this rate")
    s.add_argument(
        "--standin-drop-rate",
        type=_rate,
        default=0.0,
        help="close the connection instead of answering, at this rate",
    )
    s.add_argument(
        "--standin-slow-warmup-seconds",
        type=float,
        default=0.0,
        help="fault: extra warm-up time on top of --standin-warmup-seconds",
    )
    s.add_argument(
        "--standin-load-seconds",
        type=float,
        default=0.0,
        help="time spent 'loading the model' with the port closed, before the warm-up",
    )
    s.add_argument(
        "--standin-noncanonical-rate",
        type=_rate,
        default=0.0,
        help="share of words sampled as a non-canonical token split (same text, other ids)",
    )
    s.add_argument(
        "--standin-tool-call-rate",
        type=_rate,
        default=0.0,
        help="share of answers to a prompt offering <tools> (not answering a tool result) "
        "that call the first listed function instead of answering in prose",
    )
    s.add_argument(
        "--standin-sampled-log-dir",
        default=None,
        help="append every answered chat completion's prompt and sampled ids to "
        "DIR/sampled-<port>.jsonl (what tests check a pipeline's rows against)",
    )
    return p


def merge_config_file(parser: argparse.ArgumentParser, argv: list[str]) -> list[str]:
    """Return `argv` with `--config FILE` replaced by the file's options, placed first.

    As SGLang's `ConfigArgumentMerger`: one `--config` at most; the file must end in `.yaml`
    or `.yml` and hold a mapping of long option names; `true` adds a switch (`false` omits
    it), a list becomes one flag followed by its items, anything else `--key str(value)`.
    Options from the file come before the command line's, so argparse lets the command line
    win. A wrong file ends the program with a message naming it (exit status 2).
    """
    where = [i for i, arg in enumerate(argv) if arg == "--config"]
    if not where:
        return argv
    if len(where) > 1:
        parser.error("Multiple config files specified! Only one allowed.")
    i = where[0]
    if i == len(argv) - 1:
        parser.error("No config file specified after --config flag!")
    path = Path(argv[i + 1])
    if path.suffix.lower() not in (".yaml", ".yml"):
        parser.error(f"Config file must be YAML format, got: {path.suffix}")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        parser.error(f"cannot read config file {path}: {exc}")
    if not isinstance(data, dict):
        parser.error("Config file must contain a dictionary at root level")
    switches = {
        s for a in parser._actions if isinstance(a, argparse._StoreTrueAction)
        for s in a.option_strings
    }  # fmt: skip
    return _config_args(data, switches) + argv[:i] + argv[i + 2 :]


def _config_args(data: dict[str, Any], switches: set[str]) -> list[str]:
    out: list[str] = []
    for key, value in data.items():
        flag = f"--{key}"
        if isinstance(value, bool):
            if flag not in switches:
                out += [flag, str(value).lower()]
            elif value:
                out.append(flag)
        elif isinstance(value, list):
            if value:
                out += [flag, *(str(v) for v in value)]
        elif isinstance(value, dict):
            out += [flag, json.dumps(value)]
        else:
            out += [flag, str(value)]
    return out


def parse_args(argv: list[str] | None = None) -> ServerConfig:
    """Parse `argv` (merged with its `--config` file) into a ServerConfig.

    Unknown flags land in `ignored_args`.
    """
    parser = build_parser()
    args = merge_config_file(parser, list(sys.argv[1:] if argv is None else argv))
    ns, unknown = parser.parse_known_args(args)
    values = vars(ns)
    kwargs: dict[str, object] = {}
    for key, value in values.items():
        kwargs[key.removeprefix("standin_")] = value
    kwargs["speculative"] = {k: kwargs.pop(k) for k in list(kwargs) if k.startswith("speculative_")}
    return ServerConfig(**kwargs, ignored_args=list(unknown))  # type: ignore[arg-type]
