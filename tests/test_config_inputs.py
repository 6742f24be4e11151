"""Options and per-call settings a user gets wrong (the config review): each is refused with
a ConfigError / InvalidInputError naming it before anything is created or written, or read
the way a config file means it.  Real stores."""
from __future__ import annotations

import os

import numpy as np
import pytest
import torch

import tqstore as tq
from tqstore import ConfigError, InvalidInputError, SchemaError


@pytest.mark.parametrize("value,expected", [("false", False), ("True", True), (0, False), (np.bool_(True), True)])
def test_switches_read_config_strings_as_meant(tmp_path, value, expected):
    with tq.open(tmp_path / "s", strict_schema=value, verify_reads=value) as s:
        assert s.strict_schema is expected and s.verify_reads is expected
        s.kv_batch_put(["a"], "p", {"x": torch.ones(1, 1, dtype=torch.int64)})
        if not expected:  # "false" was strict mode: a dtype change raised SchemaError
            s.kv_batch_put(["b"], "p", {"x": torch.ones(1, 1, dtype=torch.float32)})


@pytest.mark.parametrize("kw", [dict(verify_reads=None), dict(verify_reads="no"), dict(strict_schema="yes"),
                                dict(compress=[1, 2]), dict(num_unit=2)])
def test_bad_options_raise_config_error_and_create_nothing(tmp_path, kw):
    with pytest.raises(ConfigError):
        tq.open(tmp_path / "s", **kw)
    assert not (tmp_path / "s").exists()


def test_an_empty_path_is_refused_and_a_home_path_is_expanded(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match="empty"):
        tq.open("")
    assert os.listdir(tmp_path) == []
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    with tq.open("~/buf") as s:
        assert s.root == tmp_path / "home" / "buf"
    assert not (tmp_path / "~").exists()


def test_a_numpy_integer_row_capacity_is_taken_as_num_units_is(tmp_path):
    with tq.open(tmp_path / "s", num_units=np.int64(2), total_storage_size=np.int64(10)) as s:
        assert s.num_units == 2


def test_an_omegaconf_config_that_does_not_resolve_raises_config_error():
    omegaconf = pytest.importorskip("omegaconf")
    for cfg in ({"path": "???"}, {"path": "${nope}"}):
        with pytest.raises(ConfigError, match="does not resolve"):
            tq.init(omegaconf.OmegaConf.create(cfg))


def test_seqlen_balanced_sampler_takes_its_arguments_from_the_config():
    s = tq.init({"sampler": {"name": "SeqlenBalancedSampler", "dp_size": 2, "n_samples_per_prompt": 2}})
    try:
        assert type(s.sampler).__name__ == "SeqlenBalancedSampler"
        assert (s.sampler.dp_size, s.sampler.n_samples_per_prompt) == (2, 2)
    finally:
        tq.close()
    with pytest.raises(ConfigError, match="dpsize"):
        tq.init({"controller": {"sampler": {"name": "seqlen_balanced", "dpsize": 2}}})


@pytest.mark.parametrize("n", [-2, 0, "2", 2.5, True])
def test_a_bad_per_call_group_size_raises_and_consumes_nothing(n):
    tq.init({"sampler": "grpo_group_n"})
    try:
        tq.put({"x": torch.arange(4).reshape(4, 1)}, partition_id="p")
        with pytest.raises(InvalidInputError, match="n_samples_per_prompt"):
            tq.get_meta(["x"], 4, "p", task_name="t", sampling_config={"n_samples_per_prompt": n})
        assert tq.get_meta(["x"], 4, "p", task_name="t", sampling_config={"n_samples_per_prompt": 2}).size == 4
    finally:
        tq.close()


def test_a_kind_clash_names_both_kinds_in_words(tmp_path):
    with tq.open(tmp_path / "s") as s:
        s.kv_batch_put(["a"], "p", {"x": [None]})
        with pytest.raises(SchemaError, match="holds non-tensor values, got tensor float32"):
            s.kv_batch_put(["b"], "p", {"x": torch.ones(1, 1)})


def test_a_misspelled_transferqueue_key_is_warned_about_and_a_known_one_is_not(caplog):
    with caplog.at_level("DEBUG", logger="tqstore"):
        s = tq.init({"backend": {"storage_backend": "SimpleStorage",
                                 "SimpleStorage": {"num_data_storage_unit": 4, "zmq_info": None}},
                     "controller": {"zmq_info": None, "pollingmode": True}})
        tq.close()
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert s.num_units == 1
    assert any("num_data_storage_unit" in m and "typo" in m for m in warned)
    assert any("pollingmode" in m for m in warned)
    assert not any("zmq_info" in m for m in warned)  # (TransferQueue's own key, documented as ignored)
