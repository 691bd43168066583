"""autotune.engines.variants: where each kind of variant lives, found without making anything."""

from __future__ import annotations

from autotune.engines.variants import made_variant_file
from autotune.engines.variants import package_file
from autotune.engines.variants import quantized_file

VARIANTS = {
    "shipped": {"package": "some_model_gguf"},
    "q4": {"base": "shipped", "recipe": {"ftype": "Q4_0"}},
    "q4_of_q4": {"base": "q4", "recipe": {"ftype": "Q2_K"}},
    "mine": {"path": "~/models/mine.gguf"},
}


def test_nothing_is_found_before_it_is_made(tmp_path, monkeypatch):
    monkeypatch.setenv("AUTOTUNE_CACHE", str(tmp_path))
    assert [made_variant_file(n, VARIANTS) for n in ("shipped", "q4", "q4_of_q4", "unknown")] == [
        None, None, None, None,
    ]
    assert list(tmp_path.iterdir()) == []  # looking made nothing


def test_made_files_are_found_where_making_puts_them(tmp_path, monkeypatch):
    monkeypatch.setenv("AUTOTUNE_CACHE", str(tmp_path))
    shipped = package_file("some_model_gguf")
    assert shipped.parent == tmp_path / "models"
    shipped.parent.mkdir(parents=True)
    shipped.write_bytes(b"GGUF")
    assert made_variant_file("shipped", VARIANTS) == shipped
    q4 = quantized_file(shipped, {"ftype": "Q4_0"})
    assert q4.name.startswith("some_model_gguf.q4_0.") and q4 != quantized_file(shipped, {"ftype": "Q4_1"})
    assert made_variant_file("q4", VARIANTS) is None
    q4.write_bytes(b"GGUF")
    assert made_variant_file("q4", VARIANTS) == q4
    assert made_variant_file("q4_of_q4", VARIANTS) is None


def test_a_user_path_is_taken_as_given(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    assert made_variant_file("mine", VARIANTS) == tmp_path / "models" / "mine.gguf"
