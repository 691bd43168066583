"""Reading a study directory gives records: ``read_config`` a Config, ``read_summary`` a
StudySummary, ``best_feasible`` a Record; a trial's user attributes come back as TrialAttrs."""

from __future__ import annotations

import json

import optuna
import yaml

from autotune.config.compose import compose
from autotune.config.schema import Config
from autotune.record import optuna_study as studylib
from autotune.record.study_dirs import CONFIG_FILE
from autotune.record.study_dirs import best_feasible
from autotune.record.study_dirs import constraints_as_written
from autotune.record.study_dirs import read_config
from autotune.record.study_dirs import read_summary
from autotune.record.study_dirs import storage_url
from autotune.record.summary import StudySummary
from autotune.search import trials as trialslib
from autotune.search.trials import Record


def _write_config(d, name="t", file=CONFIG_FILE):
    data = compose(["conf=local_cpu", f"study.dir=/elsewhere/{name}", f"study.name={name}"])
    d.mkdir(parents=True, exist_ok=True)
    (d / file).write_text(yaml.safe_dump(data, sort_keys=False))
    return data


def test_read_config_is_a_config_pointing_at_the_directory(tmp_path):
    d = tmp_path / "t"
    data = _write_config(d)
    cfg = read_config(d)
    assert isinstance(cfg, Config) and cfg.study.name == "t" and cfg.study.dir == str(d)
    assert cfg.raw["select"] == data["select"] and cfg.select.metric == data["select"]["metric"]
    assert constraints_as_written(cfg) == ["ppl_delta_pct <= 2.0", "ttft_p95_ms <= 1.5x baseline"]
    assert [str(c) for c in cfg.constraints] == ["ppl_delta_pct <= 2", "ttft_p95_ms <= 1.5x baseline"]
    assert storage_url(d, cfg) == f"sqlite:///{d.resolve()}/optuna.db"


def test_read_config_falls_back_to_best_yaml_with_the_study_name(tmp_path):
    d = tmp_path / "old"
    _write_config(d, "old-best", file="best.yaml")
    cfg = read_config(d)
    assert cfg.study.name == "old" and cfg.study.dir == str(d)


def test_read_summary_is_a_record_and_none_before_the_end(tmp_path):
    assert read_summary(tmp_path) is None
    s = StudySummary(study="t", engine="fake", interrupted=True, n_trials=2,
                     winner=Record(1, {"x": 1}, {"decode_tps": 5.0}), remeasured=None)
    (tmp_path / "summary.json").write_text(s.to_json())
    back = read_summary(tmp_path)
    assert back == s and back.interrupted and back.winner.number == 1
    assert (tmp_path / "summary.json").read_text() == back.to_json()
    assert json.loads(back.to_json()) == s.to_dict()
    assert back.with_warnings([]) is back and back.with_warnings(["n"]).warnings == ["n"]


def test_best_feasible_takes_and_returns_records():
    recs = [Record(0, {}, {"decode_tps": 5.0}), Record(1, {}, {"decode_tps": 9.0}, feasible=False),
            Record(2, {}, {"decode_tps": 7.0}), Record(3, {}, {"decode_tps": float("nan")})]
    assert best_feasible(recs, "decode_tps") is recs[2]
    assert best_feasible(recs[1:2], "decode_tps") is None


def test_user_attrs_are_written_and_read_through_record_study():
    st = optuna.create_study()
    t = st.ask()
    studylib.mark_launched(t, {"x": 1}, {"need_gb": [1.0], "have_gb": [2.0], "decode_tps_upper": None})
    st.tell(t, 1.0)
    t2 = st.ask()
    studylib.mark_launched(t2, {"x": 2}, None)
    st.tell(t2, 2.0)
    a, b = (trialslib.trial_attrs(x) for x in st.trials)
    assert a.kind == trialslib.LAUNCHED and a.params == {"x": 1} and a.prediction.need_gb == (1.0,)
    assert b.prediction is None and b.status is None and b.metrics == {} and b.reason == ""
    assert studylib.copied_attrs(st.trials[1]) == {"kind": "launched", "params": {"x": 2}}
    assert studylib.study_attr(st, studylib.FINGERPRINT) is None
    studylib.set_study_attr(st, studylib.FINGERPRINT, "abc")
    assert studylib.study_attr(st, studylib.FINGERPRINT) == "abc"
