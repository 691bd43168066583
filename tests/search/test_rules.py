"""Rules and ``when`` conditions: a safe expression language over trial parameters.

Table-first: what compiles and what it evaluates to, what is refused at load (with the
path, the value and a did-you-mean), and when a rule applies (inactive parameters).
"""

from __future__ import annotations

import pytest

from autotune.errors import ConfigError
from autotune.search.rules import compile_expr
from autotune.search.rules import compile_rule
from autotune.search.rules import violations

KNOWN = ["n_batch", "n_ubatch", "flash_attn", "type_v", "gpu_split", "draft_k", "model"]

EXPRESSIONS = [
    ("n_ubatch <= n_batch", {"n_ubatch": 64, "n_batch": 128}, True),
    ("n_ubatch <= n_batch", {"n_ubatch": 256, "n_batch": 128}, False),
    ("flash_attn or type_v == 'f16'", {"flash_attn": False, "type_v": "q8_0"}, False),
    ("not flash_attn", {"flash_attn": False}, True),
    ("type_v in ['f16', 'f32']", {"type_v": "f16"}, True),
    ("type_v not in ('q4_0',)", {"type_v": "q4_0"}, False),
    ("sum(gpu_split) <= 54", {"gpu_split": [30, 22]}, True),
    ("gpu_split[0] >= gpu_split[-1]", {"gpu_split": [30, 22]}, True),
    ("len(gpu_split) == 2 and max(gpu_split) < 32", {"gpu_split": [32, 20]}, False),
    ("n_batch % 64 == 0", {"n_batch": 96}, False),
    ("draft_k * 2 + 1 <= n_ubatch // 8", {"draft_k": 3, "n_ubatch": 64}, True),
    ("abs(min(draft_k, 4) - 4) < 1", {"draft_k": 9}, True),
    ("1 if flash_attn else 0", {"flash_attn": True}, 1),
]


@pytest.mark.parametrize(("text", "params", "expected"), EXPRESSIONS)
def test_expressions(text, params, expected):
    expr = compile_expr(text, KNOWN, "rules[0]")
    assert expr(params) == expected
    assert expr.names <= set(KNOWN)


BAD = [
    ("n_ubatch <= n_bach", "n_bach", "Did you mean: n_batch?"),
    ("n_ubatch <=", "n_ubatch <=", "not a valid expression"),
    ("__import__('os')", "__import__('os')", "may be called"),
    ("open('/etc/passwd')", "open('/etc/passwd')", "may be called"),
    ("model.__class__", "model.__class__", "'Attribute' is not allowed"),
    ("[x for x in gpu_split]", "[x for x in gpu_split]", "'ListComp' is not allowed"),
    ("lambda: 1", "lambda: 1", "'Lambda' is not allowed"),
    ("n_batch := 3", "n_batch := 3", "not a valid expression"),
    ("", "", "expected an expression string"),
    (3, 3, "expected an expression string"),
]


@pytest.mark.parametrize(("text", "value", "needle"), BAD)
def test_refused_at_load(text, value, needle):
    with pytest.raises(ConfigError) as e:
        compile_expr(text, KNOWN, "rules[2]")
    assert e.value.path == "rules[2]"
    assert e.value.value == value
    assert needle in str(e.value)


RULES = [
    # (rule, params, violated)
    ("n_ubatch <= n_batch", {"n_ubatch": 512, "n_batch": 64}, True),
    ("n_ubatch <= n_batch", {"n_ubatch": 64, "n_batch": 64}, False),
    (
        {"when": "type_v != 'f16'", "require": "flash_attn"},
        {"type_v": "q8_0", "flash_attn": False},
        True,
    ),
    (
        {"when": "type_v != 'f16'", "require": "flash_attn"},
        {"type_v": "f16", "flash_attn": False},
        False,
    ),
    # an inactive parameter (None) makes the rule not apply
    ("draft_k <= 4", {"draft_k": None}, False),
    (
        {"when": "draft_k > 2", "require": "n_batch >= 256"},
        {"draft_k": None, "n_batch": 64},
        False,
    ),
    # an expression that cannot be evaluated on these values counts as broken
    ("gpu_split[2] <= 10", {"gpu_split": [30, 22]}, True),
    ("n_batch / draft_k >= 1", {"n_batch": 64, "draft_k": 0}, True),
    ("model < 3", {"model": "q4_k_m"}, True),
]


@pytest.mark.parametrize(("rule", "params", "violated"), RULES)
def test_rule_violation(rule, params, violated):
    r = compile_rule(rule, KNOWN, "rules[0]")
    assert r.violated(params) is violated


def test_reasons():
    rules = [
        compile_rule(
            {"require": "n_ubatch <= n_batch", "reason": "ubatch too big"}, KNOWN, "rules[0]"
        ),
        compile_rule({"when": "flash_attn", "require": "type_v == 'f16'"}, KNOWN, "rules[1]"),
    ]
    assert rules[1].reason == "type_v == 'f16' when flash_attn"
    params = {"n_ubatch": 512, "n_batch": 64, "flash_attn": True, "type_v": "q4_0"}
    assert violations(rules, params) == ["ubatch too big", "type_v == 'f16' when flash_attn"]
    assert violations(rules, {"n_ubatch": 64, "n_batch": 64, "flash_attn": False}) == []


@pytest.mark.parametrize(
    ("item", "path", "needle"),
    [
        ({"requires": "n_batch > 0"}, "rules[0].requires", "Did you mean: require?"),
        ({"when": "flash_attn"}, "rules[0]", "needs 'require: EXPR'"),
        (
            {"require": "n_batch > 0", "when": "flash_atn"},
            "rules[0].when",
            "Did you mean: flash_attn?",
        ),
        (["n_batch > 0"], "rules[0]", "expected 'EXPR' or {require"),
    ],
)
def test_bad_rule_shapes(item, path, needle):
    with pytest.raises(ConfigError) as e:
        compile_rule(item, KNOWN, "rules[0]")
    assert e.value.path == path
    assert needle in str(e.value)
