"""build_mtp_speculative_config / mtp_engine_kwargs, checked against vLLM's own config classes."""

from __future__ import annotations

import json
import math
from collections import OrderedDict
from pathlib import Path
from typing import Any

import pytest

from patches.vllm import build_mtp_speculative_config, mtp_engine_kwargs, mtp_method_names
from tests.vllm.engine_config import engine_config
from tests.vllm.tiny_models import EXPECTED_DRAFT

KINDS = sorted(EXPECTED_DRAFT)


def verl_merge(method: Any, num_speculative_tokens: Any, overrides: dict[str, Any]) -> dict[str, Any]:
    """verl 0.9.1's merge, restated: the user's overrides are spread last and win silently."""
    return {"method": method, "num_speculative_tokens": num_speculative_tokens, **overrides}


# ---------------------------------------------------------------- what we build, and vLLM accepts


def test_defaults_are_one_mtp_token() -> None:
    """With no arguments the config asks for one MTP speculative token."""
    assert build_mtp_speculative_config() == {"method": "mtp", "num_speculative_tokens": 1}


def test_overrides_pass_through_and_none_values_are_dropped() -> None:
    """Other settings pass through unchanged; keys set to None are dropped."""
    spec = build_mtp_speculative_config("mtp", 2, {"enforce_eager": True, "draft_tensor_parallel_size": None})
    assert spec == {"method": "mtp", "num_speculative_tokens": 2, "enforce_eager": True}


def test_json_string_is_parsed_like_a_mapping() -> None:
    """A JSON object string gives the same config as the equivalent mapping."""
    text = '{"enforce_eager": true, "max_model_len": null}'
    assert build_mtp_speculative_config("mtp", 1, text) == build_mtp_speculative_config("mtp", 1, json.loads(text))


def test_json_null_means_no_overrides() -> None:
    """The JSON string 'null' counts as no overrides, like None."""
    assert build_mtp_speculative_config("mtp", 1, "null") == build_mtp_speculative_config("mtp", 1, None)


def test_any_mapping_type_is_accepted() -> None:
    """Any Mapping (here an OrderedDict) is accepted, and the result is a plain dict."""
    spec = build_mtp_speculative_config("mtp", 1, OrderedDict(enforce_eager=False))
    assert type(spec) is dict and spec["enforce_eager"] is False


def test_integral_types_are_accepted_as_plain_int() -> None:
    """An int subclass that is not a bool (numpy-style integers are Integral too) comes back a plain int."""

    class MyInt(int):
        pass

    spec = build_mtp_speculative_config("mtp", MyInt(3))
    assert spec["num_speculative_tokens"] == 3 and type(spec["num_speculative_tokens"]) is int


@pytest.mark.parametrize("alias", ["deepseek_mtp", "qwen3_next_mtp", "mimo_mtp", "mtp"])
def test_aliases_are_normalised_to_mtp(alias: str) -> None:
    """Every vLLM MTP alias becomes "mtp", as vLLM >= 0.11 itself rewrites it (with a deprecation warning)."""
    assert build_mtp_speculative_config(alias, 1)["method"] == "mtp"


def test_repeating_an_explicit_setting_with_an_equal_value_is_fine() -> None:
    """An override may repeat method (as any alias) and num_speculative_tokens when it agrees."""
    spec = build_mtp_speculative_config("mtp", 2, {"method": "deepseek_mtp", "num_speculative_tokens": 2})
    assert spec == {"method": "mtp", "num_speculative_tokens": 2}


def test_method_names_come_from_the_installed_vllm(vllm: Any) -> None:
    """The accepted method names are exactly typing.get_args(MTPModelTypes) of the installed vLLM."""
    import typing

    from vllm.config.speculative import MTPModelTypes

    assert mtp_method_names() == typing.get_args(MTPModelTypes)


def test_builtin_method_list_matches_the_pinned_vllm(vllm: Any) -> None:
    """The fallback list (used only without vLLM) equals MTPModelTypes of the pinned vLLM 0.33.0."""
    from patches.vllm._compat import BUILTIN_MTP_METHODS, vllm_version

    if vllm_version() != "0.33.0":
        pytest.skip(f"the built-in list mirrors vLLM 0.33.0, installed is {vllm_version()}")
    assert set(BUILTIN_MTP_METHODS) == set(mtp_method_names())


@pytest.mark.parametrize("kind", KINDS)
def test_speculative_config_accepted_by_vllm(kind: str, make_speculative_config: Any) -> None:
    """vLLM's SpeculativeConfig accepts our config for each MTP family, resolving method "mtp" and its draft."""
    alias, draft_arch = EXPECTED_DRAFT[kind]
    spec = make_speculative_config(kind, build_mtp_speculative_config(alias, 1, {"enforce_eager": True}))
    assert spec.method == "mtp"
    assert spec.num_speculative_tokens == 1
    assert spec.draft_model_config.architectures == [draft_arch]
    assert spec.draft_model_config.hf_config.n_predict == 1


def test_more_tokens_than_mtp_layers_reuse_the_layer(make_speculative_config: Any) -> None:
    """Two speculative tokens over one MTP layer are accepted by vLLM (the layer is run twice)."""
    spec = make_speculative_config("deepseek_v3", build_mtp_speculative_config("mtp", 2))
    assert spec.num_speculative_tokens == 2


@pytest.mark.parametrize("kind", KINDS)
def test_engine_config_accepts_mtp_engine_kwargs(kind: str, vllm: Any, model_dirs: dict[str, Path]) -> None:
    """EngineArgs(**mtp_engine_kwargs(...)).create_engine_config() succeeds and turns on per-request metrics."""
    config = engine_config(model_dirs[kind], **mtp_engine_kwargs("mtp", 1, {"enforce_eager": True}))
    assert config.speculative_config.method == "mtp"
    assert config.speculative_config.draft_model_config.architectures == [EXPECTED_DRAFT[kind][1]]
    assert config.observability_config.per_request_spec_decode_metrics == "summary"


def test_engine_kwargs_reject_an_unknown_metrics_level(vllm: Any, model_dirs: dict[str, Path]) -> None:
    """per_request_metrics must be one of vLLM's levels; vLLM rejects others only at engine creation."""
    from pydantic import ValidationError

    with pytest.raises(ValueError, match="per_request_metrics must be one of"):
        mtp_engine_kwargs(per_request_metrics="full")
    with pytest.raises(ValidationError, match="per_request_spec_decode_metrics"):
        engine_config(
            model_dirs["deepseek_v3"],
            speculative_config=build_mtp_speculative_config(),
            per_request_spec_decode_metrics="full",
        )


def test_without_per_request_metrics_vllm_records_none(vllm: Any, model_dirs: dict[str, Path]) -> None:
    """Given only a speculative config, vLLM leaves per-request metrics off: why mtp_engine_kwargs sets them."""
    config = engine_config(model_dirs["deepseek_v3"], speculative_config=build_mtp_speculative_config())
    assert config.observability_config.per_request_spec_decode_metrics == "none"


# ---------------------------------------------------------------- inputs we reject, and what vLLM does with them


@pytest.mark.parametrize("value", [True, "2"])
def test_coerced_token_counts_are_rejected(value: Any, make_speculative_config: Any) -> None:
    """True and "2" are rejected; vLLM silently coerces them to 1 and 2."""
    with pytest.raises(ValueError, match=r"num_speculative_tokens must be an int >= 1.*" + repr(value)):
        build_mtp_speculative_config("mtp", value)
    coerced = make_speculative_config("deepseek_v3", {"method": "mtp", "num_speculative_tokens": value})
    assert coerced.num_speculative_tokens == int(value)


@pytest.mark.parametrize(("value", "vllm_says"), [(1.5, "fractional part"), (0, "greater than 0")])
def test_bad_token_counts_fail_here_not_at_engine_start(
    value: Any, vllm_says: str, make_speculative_config: Any
) -> None:
    """1.5 and 0 are rejected when the config is built; vLLM rejects them only when the engine is created."""
    from pydantic import ValidationError

    with pytest.raises(ValueError, match="num_speculative_tokens must be an int >= 1"):
        build_mtp_speculative_config("mtp", value)
    with pytest.raises(ValidationError, match=vllm_says):
        make_speculative_config("deepseek_v3", {"method": "mtp", "num_speculative_tokens": value})


def test_float_token_count_with_integral_value_is_rejected(make_speculative_config: Any) -> None:
    """2.0 is rejected (a float from a YAML typo); vLLM silently coerces it to 2."""
    with pytest.raises(ValueError, match=r"2\.0"):
        build_mtp_speculative_config("mtp", 2.0)
    assert (
        make_speculative_config("deepseek_v3", {"method": "mtp", "num_speculative_tokens": 2.0}).num_speculative_tokens
        == 2
    )


def test_override_changing_num_tokens_is_rejected(make_speculative_config: Any) -> None:
    """An override changing num_speculative_tokens raises naming both values; verl's merge lets vLLM run with it."""
    with pytest.raises(ValueError, match=r"num_speculative_tokens=3.*contradicts num_speculative_tokens=1"):
        build_mtp_speculative_config("mtp", 1, {"num_speculative_tokens": 3})
    silently = make_speculative_config("deepseek_v3", verl_merge("mtp", 1, {"num_speculative_tokens": 3}))
    assert silently.num_speculative_tokens == 3


def test_override_changing_method_is_rejected(make_speculative_config: Any) -> None:
    """An override switching method away from MTP raises naming both; verl's merge lets vLLM switch to ngram."""
    with pytest.raises(ValueError, match=r"method='ngram'.*contradicts method='mtp'"):
        build_mtp_speculative_config("mtp", 1, '{"method": "ngram"}')
    silently = make_speculative_config("deepseek_v3", verl_merge("mtp", 1, {"method": "ngram"}))
    assert silently.method == "ngram"


def test_override_with_invalid_equal_looking_value_is_rejected(make_speculative_config: Any) -> None:
    """An override of "1" next to num_speculative_tokens=1 raises naming both; verl's merge lets vLLM coerce it."""
    with pytest.raises(ValueError, match=r"num_speculative_tokens='1'.*contradicts num_speculative_tokens=1"):
        build_mtp_speculative_config("mtp", 1, {"num_speculative_tokens": "1"})
    coerced = make_speculative_config("deepseek_v3", verl_merge("mtp", 1, {"num_speculative_tokens": "1"}))
    assert coerced.num_speculative_tokens == 1


def test_hyphenated_key_cannot_sneak_past_the_precedence_rule(vllm: Any, model_dirs: dict[str, Path]) -> None:
    """A hyphenated num-speculative-tokens is read as num_speculative_tokens (as vLLM does), so contradicting still raises."""
    with pytest.raises(ValueError, match="contradicts"):
        build_mtp_speculative_config("mtp", 1, {"num-speculative-tokens": 3})
    config = engine_config(
        model_dirs["deepseek_v3"], speculative_config=verl_merge("mtp", 1, {"num-speculative-tokens": 3})
    )
    assert config.speculative_config.num_speculative_tokens == 3  # vLLM: the hyphenated key silently wins


def test_two_spellings_of_one_key_are_rejected(vllm: Any, model_dirs: dict[str, Path]) -> None:
    """Setting a key both with '-' and '_' raises; vLLM's EngineArgs keeps the later one silently."""
    both = {"enforce-eager": True, "enforce_eager": False}
    with pytest.raises(ValueError, match="'enforce_eager' twice, as 'enforce-eager' and 'enforce_eager'"):
        build_mtp_speculative_config("mtp", 1, both)
    config = engine_config(model_dirs["deepseek_v3"], speculative_config=verl_merge("mtp", 1, both))
    assert config.speculative_config.enforce_eager is False


@pytest.mark.parametrize("method", ["eagle", "MTP", "deepseek", 3, None])
def test_non_mtp_methods_are_rejected(method: Any, make_speculative_config: Any) -> None:
    """method must be "mtp" or an MTP alias; vLLM fails on these only at engine creation, or runs eagle/ngram."""
    from pydantic import ValidationError

    with pytest.raises(ValueError, match=r"method must be 'mtp' or one of the MTP aliases"):
        build_mtp_speculative_config(method, 1)
    with pytest.raises(ValidationError):
        make_speculative_config("deepseek_v3", {"method": method, "num_speculative_tokens": 1})


def test_method_typo_gets_a_suggestion() -> None:
    """A near miss names the closest MTP method."""
    with pytest.raises(ValueError, match="Did you mean 'deepseek_mtp'"):
        build_mtp_speculative_config("deepseek_mpt", 1)


def test_unknown_key_is_rejected_early_with_a_suggestion(make_speculative_config: Any) -> None:
    """A misspelt key raises now with a suggestion; vLLM raises only at engine creation."""
    from pydantic import ValidationError

    with pytest.raises(ValueError, match="Did you mean 'num_speculative_tokens'"):
        build_mtp_speculative_config("mtp", 1, {"num_spec_tokens": 2})
    with pytest.raises(ValidationError, match="num_spec_tokens"):
        make_speculative_config("deepseek_v3", verl_merge("mtp", 1, {"num_spec_tokens": 2}))


@pytest.mark.parametrize("spelling", ["tensor_parallel_size", "tensor-parallel-size"])
def test_tensor_parallel_size_is_rejected_naming_its_replacement(spelling: str, make_speculative_config: Any) -> None:
    """vLLM's validator rejects tensor_parallel_size whatever its value; here it fails when building, naming the key to use."""
    from pydantic import ValidationError

    with pytest.raises(ValueError, match="set 'draft_tensor_parallel_size' instead"):
        build_mtp_speculative_config("mtp", 1, {spelling: 1})
    with pytest.raises(ValidationError, match="Please pass 'draft_tensor_parallel_size' instead"):
        make_speculative_config("deepseek_v3", verl_merge("mtp", 1, {"tensor_parallel_size": 1}))
    spec = build_mtp_speculative_config("mtp", 1, {"draft_tensor_parallel_size": 1, "tensor_parallel_size": None})
    assert make_speculative_config("deepseek_v3", spec).draft_tensor_parallel_size == 1


def test_always_rejected_keys_are_read_from_the_installed_vllm(make_speculative_config: Any) -> None:
    """Every key read as always-rejected is refused by the real SpeculativeConfig, and by the builder, for any value."""
    from pydantic import ValidationError

    from patches.vllm._compat import rejected_speculative_keys, speculative_config_keys

    rejected = rejected_speculative_keys()
    assert "tensor_parallel_size" in rejected  # vLLM 0.9.2-0.34.0
    for key, why in rejected.items():
        assert why.replacement is None or why.replacement in (speculative_config_keys() or ())
        for value in (1, 2):
            with pytest.raises(ValidationError, match=key):
                make_speculative_config("deepseek_v3", verl_merge("mtp", 1, {key: value}))
            with pytest.raises(ValueError, match=f"{key!r}, which vLLM .* rejects whatever its value"):
                build_mtp_speculative_config("mtp", 1, {key: value})


def test_engine_provided_keys_are_rejected(vllm: Any, model_dirs: dict[str, Path]) -> None:
    """target_model_config in the overrides raises; vLLM's EngineArgs silently replaces it."""
    with pytest.raises(ValueError, match="may not set target_model_config"):
        build_mtp_speculative_config("mtp", 1, {"target_model_config": "my-model"})
    config = engine_config(
        model_dirs["deepseek_v3"], speculative_config=verl_merge("mtp", 1, {"target_model_config": "x"})
    )
    assert config.speculative_config.target_model_config is not None  # "x" was dropped without a word


def test_malformed_json_names_the_setting_and_position(vllm: Any, model_dirs: dict[str, Path]) -> None:
    """Malformed JSON raises ValueError naming the setting and the error position; vLLM fails with an AttributeError."""
    with pytest.raises(
        ValueError, match=r"rollout.speculative_config is not valid JSON: .* line 1 column 19 \(char 18\)"
    ):
        build_mtp_speculative_config("mtp", 1, '{"enforce_eager": tru}', setting="rollout.speculative_config")
    with pytest.raises(AttributeError, match="'str' object has no attribute 'items'"):
        engine_config(model_dirs["deepseek_v3"], speculative_config='{"enforce_eager": tru}')


def test_json_duplicate_keys_and_nan_are_rejected(vllm: Any) -> None:
    """Duplicate JSON keys and NaN raise; vLLM's own --speculative-config parser keeps the last value and NaN."""
    from vllm.engine.arg_utils import EngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    twice = '{"num_speculative_tokens": 1, "num_speculative_tokens": 3}'
    nan = '{"synthetic_acceptance_length": NaN}'
    with pytest.raises(ValueError, match="'num_speculative_tokens' appears twice"):
        build_mtp_speculative_config("mtp", 1, twice)
    with pytest.raises(ValueError, match="NaN is not a JSON number"):
        build_mtp_speculative_config("mtp", 1, nan)
    parser = EngineArgs.add_cli_args(FlexibleArgumentParser())
    assert parser.parse_args(["--speculative-config", twice]).speculative_config["num_speculative_tokens"] == 3
    assert math.isnan(
        parser.parse_args(["--speculative-config", nan]).speculative_config["synthetic_acceptance_length"]
    )


@pytest.mark.parametrize("value", [[("enforce_eager", True)], "[1]", 42])
def test_non_mapping_overrides_raise_type_error(value: Any, vllm: Any, model_dirs: dict[str, Path]) -> None:
    """A list, a JSON array or a number raises TypeError; vLLM fails with an AttributeError at engine creation."""
    with pytest.raises(TypeError, match="must be a mapping, a JSON object string or None"):
        build_mtp_speculative_config("mtp", 1, value)
    if isinstance(value, list):
        with pytest.raises(AttributeError, match="has no attribute 'items'"):
            engine_config(model_dirs["deepseek_v3"], speculative_config=value)


def test_non_string_keys_raise_type_error(vllm: Any, model_dirs: dict[str, Path]) -> None:
    """A mapping with a non-string key raises TypeError; vLLM fails with an AttributeError at engine creation."""
    with pytest.raises(TypeError, match="keys must be strings"):
        build_mtp_speculative_config("mtp", 1, {1: True})
    with pytest.raises(AttributeError, match="'int' object has no attribute 'replace'"):
        engine_config(model_dirs["deepseek_v3"], speculative_config=verl_merge("mtp", 1, {1: True}))


def test_the_string_is_never_evaluated() -> None:
    """A Python expression is not evaluated: it is malformed JSON."""
    with pytest.raises(ValueError, match="not valid JSON"):
        build_mtp_speculative_config("mtp", 1, "__import__('os').system('false') or {}")
    with pytest.raises(ValueError, match="not valid JSON"):
        build_mtp_speculative_config("mtp", 1, "{'enforce_eager': True}")
