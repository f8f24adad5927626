"""MTP speculative rollout on vLLM: a speculative config vLLM accepts, and its acceptance stats.

- :func:`build_mtp_speculative_config` merges a user's extra vLLM speculative
  settings with the two MTP settings. The two explicit arguments win: an
  override may repeat them with an equal value, never change them.
- :func:`mtp_engine_kwargs` adds the engine setting without which vLLM records
  no per-request acceptance numbers (``per_request_spec_decode_metrics``).
- :func:`spec_decode_stats` reads those numbers from a finished
  ``vllm.RequestOutput``; :func:`rollout_metrics` aggregates a batch for logging.
"""

from __future__ import annotations

import difflib
import json
import logging
import numbers
import threading
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

import attrs

from patches.vllm._compat import (
    ENGINE_PROVIDED_KEYS,
    HAS_MTP_METHOD,
    HAS_PER_REQUEST_METRICS,
    LOSES_METRICS_ON_DELTA_MERGE,
    VLLM_INSTALLED,
    mtp_method_names,
    rejected_speculative_keys,
    speculative_config_keys,
    vllm_version,
)

__all__ = [
    "PER_REQUEST_METRICS_LEVELS",
    "SpecDecodeStats",
    "build_mtp_speculative_config",
    "mtp_engine_kwargs",
    "rollout_metrics",
    "spec_decode_stats",
]

logger = logging.getLogger("patchreg.vllm")

PER_REQUEST_METRICS_LEVELS: Final = ("none", "summary", "detailed")
_DEFAULT_SETTING: Final = "engine_speculative_config"

# --------------------------------------------------------------------------- config


def build_mtp_speculative_config(
    method: str = "mtp",
    num_speculative_tokens: int = 1,
    engine_speculative_config: Mapping[str, Any] | str | None = None,
    *,
    setting: str = _DEFAULT_SETTING,
) -> dict[str, Any]:
    """Return the ``speculative_config`` dict for vLLM MTP rollout.

    ``engine_speculative_config`` holds the user's other vLLM speculative
    settings: a mapping, a JSON object string (parsed with :func:`json.loads`,
    never evaluated) or None. Keys whose value is None are dropped; ``-`` in a
    key is read as ``_`` (as vLLM's ``EngineArgs`` does). ``method``
    and ``num_speculative_tokens`` take precedence: an override that repeats
    them must agree (``"deepseek_mtp"`` agrees with ``"mtp"``), else
    ``ValueError`` names both values. ``setting`` is the name used in error
    messages (e.g. ``"rollout.engine_kwargs.vllm.speculative_config"``).

    Raises ``TypeError`` for a non-mapping override and ``ValueError`` for
    malformed JSON, an invalid ``method`` or ``num_speculative_tokens``, a
    contradicting override, or (with vLLM installed) a key vLLM does not know.
    """
    _require_mtp_capable_vllm()
    method = _normalise_method(method, "method")
    num_speculative_tokens = _check_num_tokens(num_speculative_tokens, "num_speculative_tokens")
    overrides = _load_overrides(engine_speculative_config, setting)
    _check_keys(overrides, setting)
    _check_agrees(overrides, setting, method=method, num_speculative_tokens=num_speculative_tokens)
    rest = {k: v for k, v in overrides.items() if k not in ("method", "num_speculative_tokens")}
    return {"method": method, "num_speculative_tokens": num_speculative_tokens, **rest}


def mtp_engine_kwargs(
    method: str = "mtp",
    num_speculative_tokens: int = 1,
    engine_speculative_config: Mapping[str, Any] | str | None = None,
    *,
    per_request_metrics: str = "summary",
    setting: str = _DEFAULT_SETTING,
) -> dict[str, Any]:
    """Return the ``EngineArgs``/``AsyncEngineArgs`` keywords for MTP rollout with stats.

    ``{"speculative_config": build_mtp_speculative_config(...),
    "per_request_spec_decode_metrics": per_request_metrics}``; the second key is
    left out on vLLM releases before 0.29, which have no per-request metrics
    (:func:`spec_decode_stats` then returns None and says so once).
    """
    if per_request_metrics not in PER_REQUEST_METRICS_LEVELS:
        msg = f"per_request_metrics must be one of {PER_REQUEST_METRICS_LEVELS!r}, got {per_request_metrics!r}."
        raise ValueError(msg)
    kwargs: dict[str, Any] = {
        "speculative_config": build_mtp_speculative_config(
            method, num_speculative_tokens, engine_speculative_config, setting=setting
        )
    }
    if HAS_PER_REQUEST_METRICS.evaluate().ok or not VLLM_INSTALLED.evaluate().ok:
        kwargs["per_request_spec_decode_metrics"] = per_request_metrics
    else:
        logger.info("Not setting per_request_spec_decode_metrics: %s.", HAS_PER_REQUEST_METRICS.evaluate().reason)
    return kwargs


def _require_mtp_capable_vllm() -> None:
    answer = HAS_MTP_METHOD.evaluate()
    if VLLM_INSTALLED.evaluate().ok and not answer.ok:
        msg = (
            f"The installed vLLM has no speculative method 'mtp' ({answer.reason}); "
            "MTP rollout needs vllm>=0.11, and per-request acceptance stats need vllm>=0.29."
        )
        raise ValueError(msg)


def _normalise_method(value: object, name: str) -> str:
    names = mtp_method_names()
    if not isinstance(value, str) or value not in names:
        hint = difflib.get_close_matches(str(value).lower(), names, n=1)
        suggestion = f" Did you mean {hint[0]!r}?" if hint else ""
        msg = (
            f"{name} must be 'mtp' or one of the MTP aliases of vLLM {vllm_version() or '(not installed)'} "
            f"({', '.join(n for n in names if n != 'mtp')}), got {value!r}.{suggestion}"
        )
        raise ValueError(msg)
    return "mtp"  # every alias is deprecated in favour of "mtp" (vLLM >= 0.11)


def _check_num_tokens(value: object, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or int(value) < 1:
        msg = f"{name} must be an int >= 1 (not a bool, str or float), got {value!r} ({type(value).__name__})."
        raise ValueError(msg)
    return int(value)


def _load_overrides(value: object, setting: str) -> dict[str, Any]:
    if isinstance(value, str):
        value = _parse_json(value, setting)
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        msg = f"{setting} must be a mapping, a JSON object string or None, got {type(value).__name__}: {value!r}."
        raise TypeError(msg)
    bad = [k for k in value if not isinstance(k, str)]
    if bad:
        msg = f"{setting} keys must be strings naming vLLM SpeculativeConfig fields, got {bad!r}."
        raise TypeError(msg)
    return _underscore_keys({k: v for k, v in value.items() if v is not None}, setting)


def _underscore_keys(overrides: Mapping[str, Any], setting: str) -> dict[str, Any]:
    """Spell keys as vLLM's ``EngineArgs`` does (``-`` read as ``_``); two spellings of one key clash."""
    result: dict[str, Any] = {}
    spelled: dict[str, str] = {}
    for key, val in overrides.items():
        name = key.replace("-", "_")
        if name in result:
            msg = f"{setting} sets {name!r} twice, as {spelled[name]!r} and {key!r}; vLLM would keep one silently."
            raise ValueError(msg)
        result[name], spelled[name] = val, key
    return result


def _parse_json(text: str, setting: str) -> Any:
    try:
        return json.loads(text, object_pairs_hook=_unique_keys, parse_constant=_reject_constant)
    except json.JSONDecodeError as exc:
        msg = (
            f"{setting} is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno} "
            f"(char {exc.pos}) of {_shorten(text)}."
        )
        raise ValueError(msg) from exc
    except _JSONContentError as exc:
        msg = f"{setting} is not acceptable JSON: {exc}."
        raise ValueError(msg) from None


def _shorten(text: str, limit: int = 200) -> str:
    return repr(text) if len(text) <= limit else repr(text[:limit]) + f"... ({len(text)} chars)"


class _JSONContentError(ValueError):
    """Valid JSON syntax that the config must not contain (duplicate keys, NaN)."""


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, val in pairs:
        if key in result:
            msg = f"key {key!r} appears twice ({result[key]!r} and {val!r})"
            raise _JSONContentError(msg)
        result[key] = val
    return result


def _reject_constant(name: str) -> Any:
    msg = f"{name} is not a JSON number"
    raise _JSONContentError(msg)


def _check_keys(overrides: Mapping[str, Any], setting: str) -> None:
    engine_keys = sorted(ENGINE_PROVIDED_KEYS.intersection(overrides))
    if engine_keys:
        msg = f"{setting} may not set {', '.join(engine_keys)}: the vLLM engine fills these in from the target model."
        raise ValueError(msg)
    known = speculative_config_keys()
    if known is None:
        return
    rejected = rejected_speculative_keys()
    for key in overrides:
        if key in rejected:
            instead = rejected[key].replacement
            use = f": set {instead!r} instead" if instead else ""
            msg = (
                f"{setting} has {key!r}, which vLLM {vllm_version()} SpeculativeConfig rejects whatever "
                f"its value{use} (vLLM: {rejected[key].message})"
            )
            raise ValueError(msg)
        if key not in known:
            hint = difflib.get_close_matches(key, sorted(known), n=1)
            suggestion = f" Did you mean {hint[0]!r}?" if hint else ""
            msg = f"{setting} has {key!r}, which vLLM {vllm_version()} SpeculativeConfig does not take.{suggestion}"
            raise ValueError(msg)


_WHAT: Final = {"method": "an MTP method", "num_speculative_tokens": "an int >= 1"}


def _check_agrees(overrides: Mapping[str, Any], setting: str, **explicit: Any) -> None:
    checks = {"method": _normalise_method, "num_speculative_tokens": _check_num_tokens}
    for key, wanted in explicit.items():
        if key not in overrides:
            continue
        given = overrides[key]
        try:
            agrees, why = checks[key](given, f"{setting}[{key!r}]") == wanted, ""
        except ValueError:
            agrees, why = False, f" (and {given!r} is not {_WHAT[key]})"
        if not agrees:
            msg = (
                f"{setting} sets {key}={given!r}, which contradicts {key}={wanted!r}{why}; "
                f"set {key} in one place only, or to the same value."
            )
            raise ValueError(msg)


# --------------------------------------------------------------------------- stats


def _non_negative(_instance: Any, attribute: attrs.Attribute[Any], value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        msg = f"SpecDecodeStats.{attribute.name} must be an int >= 0, got {value!r}."
        raise ValueError(msg)


def _int_tuple(values: Iterable[int]) -> tuple[int, ...]:
    return tuple(int(v) for v in values)


@attrs.frozen
class SpecDecodeStats:
    """Speculative-decoding acceptance numbers of one request (summed over its completions).

    ``num_verify_steps`` counts target-model verify steps that checked drafts;
    ``num_accepted_tokens`` counts accepted draft tokens (bonus tokens excluded).
    """

    num_draft_tokens: int = attrs.field(validator=_non_negative)
    num_accepted_tokens: int = attrs.field(validator=_non_negative)
    num_verify_steps: int = attrs.field(validator=_non_negative)
    acceptance_histogram: tuple[int, ...] = attrs.field(default=(), converter=_int_tuple)
    num_sequences: int = attrs.field(default=1, validator=_non_negative)

    @property
    def acceptance_rate(self) -> float:
        """Accepted / drafted tokens; 0.0 when nothing was drafted (as vLLM reports it)."""
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0

    @property
    def mean_acceptance_length(self) -> float:
        """Tokens emitted per verify step, bonus token included; 1.0 without verify steps (as vLLM)."""
        return 1.0 + self.num_accepted_tokens / self.num_verify_steps if self.num_verify_steps else 1.0

    def as_extra_fields(self) -> dict[str, int]:
        """The three counts under the names verl's trainers read (``spec_num_*``)."""
        return {
            "spec_num_draft_tokens": self.num_draft_tokens,
            "spec_num_accepted_tokens": self.num_accepted_tokens,
            "spec_num_verify_steps": self.num_verify_steps,
        }


_warned_lock = threading.Lock()
_warned = False


def _reset_missing_warning() -> None:
    """Let the next missing-stats warning through again (for tests)."""
    global _warned
    with _warned_lock:
        _warned = False


def _warn_missing_once() -> None:
    global _warned
    with _warned_lock:
        if _warned:
            return
        _warned = True
    logger.warning("%s", _missing_message())


def _missing_message() -> str:
    answer = HAS_PER_REQUEST_METRICS.evaluate()
    if not answer.ok:
        return (
            f"vLLM cannot report per-request speculative-decoding stats ({answer.reason}); "
            "install vllm>=0.29 and start the engine with per_request_spec_decode_metrics='summary'. "
            "spec_decode_stats() returns None until then; this warning is shown once."
        )
    msg = (
        "vLLM did not record per-request speculative-decoding stats (a finished "
        "CompletionOutput.spec_decode_metrics is None): start the engine with "
        "per_request_spec_decode_metrics='summary' (or 'detailed'), e.g. "
        "EngineArgs(..., **mtp_engine_kwargs(...)). spec_decode_stats() returns None until then; "
        "this warning is shown once."
    )
    if LOSES_METRICS_ON_DELTA_MERGE.evaluate().ok:
        msg += (
            " With output_kind=DELTA this vLLM release also drops them when merging outputs: "
            "apply patches.vllm.SPEC_DECODE_METRICS_FIXES."
        )
    return msg


def spec_decode_stats(request_output: Any) -> SpecDecodeStats | None:
    """Read the acceptance stats of one ``vllm.RequestOutput``, or None when vLLM recorded none.

    Sums ``outputs[i].spec_decode_metrics`` over the request's finished
    completions; the verify steps and accepted tokens come from the acceptance
    histogram (or, lacking one, the per-step arrays of the ``detailed`` level).
    vLLM attaches them to each completion's final output only, so an output
    with no finished completion gives None quietly. A streamed request with
    ``n > 1`` sends each child's final completion in its own output (only the
    last has ``finished=True``): each such output gives that child's stats, so
    call this on every streamed output that has a finished completion.
    When a finished completion has none, the engine is not recording them:
    warns once per process (naming ``per_request_spec_decode_metrics``) and
    returns None. Never raises on a missing attribute; a list of outputs is a
    ``TypeError``.
    """
    if isinstance(request_output, (list, tuple)):
        msg = (
            "spec_decode_stats() takes one vllm RequestOutput, got a "
            f"{type(request_output).__name__}; for a batch use [spec_decode_stats(o) for o in outputs]."
        )
        raise TypeError(msg)
    request_finished = getattr(request_output, "finished", True) is not False
    completions = getattr(request_output, "outputs", None) or ()
    metrics, missing = [], False
    for completion in completions:
        completion_finished = getattr(completion, "finish_reason", None) is not None
        if not (request_finished or completion_finished):
            continue  # still generating: its metrics arrive with its final completion
        found = getattr(completion, "spec_decode_metrics", None)
        if found is not None:
            metrics.append(found)
        elif completion_finished:
            missing = True
    if missing:
        _warn_missing_once()
        return None
    return _sum_metrics(metrics) if metrics else None


def _sum_metrics(metrics: Sequence[Any]) -> SpecDecodeStats:
    drafted = accepted = steps = 0
    histogram: list[int] = []
    for m in metrics:
        hist = [int(c) for c in getattr(m, "histogram", None) or ()]
        if hist:
            steps += sum(hist)
            accepted += sum(j * c for j, c in enumerate(hist))
            histogram = [a + b for a, b in _zip_padded(histogram, hist)]
        else:
            per_step = [int(c) for c in getattr(m, "per_step_accepted", None) or ()]
            steps += len(per_step)
            accepted += sum(per_step)
        drafted += int(getattr(m, "num_draft_tokens", 0) or 0)
    return SpecDecodeStats(drafted, accepted, steps, histogram, num_sequences=len(metrics))


def _zip_padded(a: Sequence[int], b: Sequence[int]) -> Iterable[tuple[int, int]]:
    n = max(len(a), len(b))
    return zip([*a, *[0] * (n - len(a))], [*b, *[0] * (n - len(b))], strict=True)


def rollout_metrics(stats_list: Iterable[SpecDecodeStats | None], *, prefix: str = "rollout/") -> dict[str, float]:
    """Aggregate a batch of :func:`spec_decode_stats` results into the numbers a trainer logs.

    ``spec_accept_rate`` / ``spec_accept_length`` are per-request means (each
    request weighs the same, as in verl), over the requests that drafted at
    least once; the ``_pooled`` variants divide batch totals (each token weighs
    the same). Totals and counts of requests with and without stats are always
    present; the ratios only when some request has stats. None entries count
    as missing.

    Acceptance cannot tell a stale drafter from a hard batch: after a weight sync
    that left the MTP drafter behind (vLLM's ``reload_weights`` writes the target
    only), drafts keep coming and few are accepted. Ask the workers with
    :func:`patches.vllm.drafter_status`.
    """
    stats = list(stats_list)
    present = [s for s in stats if s is not None]
    wrong = [s for s in present if not isinstance(s, SpecDecodeStats)]
    if wrong:
        msg = f"rollout_metrics() takes SpecDecodeStats or None entries, got {wrong[0]!r}."
        raise TypeError(msg)
    out: dict[str, float] = {
        f"{prefix}spec_num_requests": len(present),
        f"{prefix}spec_num_requests_missing": len(stats) - len(present),
        f"{prefix}spec_num_draft_tokens": sum(s.num_draft_tokens for s in present),
        f"{prefix}spec_num_accepted_tokens": sum(s.num_accepted_tokens for s in present),
        f"{prefix}spec_num_verify_steps": sum(s.num_verify_steps for s in present),
    }
    if present:
        out.update(_ratios(present, prefix))
    return out


def _ratios(present: Sequence[SpecDecodeStats], prefix: str) -> dict[str, float]:
    rates = [s.acceptance_rate for s in present if s.num_draft_tokens]
    lengths = [s.mean_acceptance_length for s in present if s.num_verify_steps]
    pooled = SpecDecodeStats(
        sum(s.num_draft_tokens for s in present),
        sum(s.num_accepted_tokens for s in present),
        sum(s.num_verify_steps for s in present),
    )
    return {
        f"{prefix}spec_accept_rate": sum(rates) / len(rates) if rates else 0.0,
        f"{prefix}spec_accept_length": sum(lengths) / len(lengths) if lengths else 1.0,
        f"{prefix}spec_accept_rate_pooled": pooled.acceptance_rate,
        f"{prefix}spec_accept_length_pooled": pooled.mean_acceptance_length,
    }
