"""ReplaySettings: checked once when made, unchanged across the process boundary."""

from __future__ import annotations

import dataclasses

import pytest

import reproarchive
from reproarchive import ReplaySettings
from reproarchive.errors import ReproArchiveError


def test_plain_round_trip_keeps_every_field():
    settings = ReplaySettings(backend="aot_eager", accuracy=True, only_fwd=True, current_config=True, tol=0.5,
                              strict_accuracy=False, device={"cuda:0": "cpu"}, max_memory=1 << 20)
    plain = settings.to_plain()
    assert plain["device"] == {"cuda:0": "cpu"} and type(plain["device"]) is dict
    assert ReplaySettings.from_plain(plain) == settings


@pytest.mark.parametrize("bad", [{"tol": 0}, {"tol": float("nan")}, {"max_memory": -1}, {"backend": ""},
                                 {"device": {"cuda:0": ""}}])
def test_bad_values_are_refused_when_made(bad):
    with pytest.raises(ReproArchiveError):
        ReplaySettings(**bad)


def test_frozen_and_device_mapping_read_only():
    settings = ReplaySettings(device={"cuda": "cpu"})
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.backend = "eager"
    with pytest.raises(TypeError):
        settings.device["cuda"] = "cuda:1"


def test_for_recorded_fills_only_what_was_not_chosen():
    assert ReplaySettings().for_recorded("inductor", None) == ReplaySettings(backend="inductor", accuracy=False)
    chosen = ReplaySettings(backend="eager", accuracy=False).for_recorded("inductor", {"tolerance": 1e-3})
    assert (chosen.backend, chosen.accuracy) == ("eager", False)


def test_public_run_takes_a_value_or_its_fields_not_both(tmp_path):
    with pytest.raises(TypeError):
        reproarchive.run(tmp_path / "x.tar.zst", ReplaySettings(), backend="eager")
    with pytest.raises(TypeError):
        reproarchive.run(tmp_path / "x.tar.zst", no_such_option=True)


def test_an_in_process_run_decodes_the_index_once(tmp_path, monkeypatch):
    """``run`` asks the index whether to isolate, then loads from the same reader."""
    from reproarchive.format import reader as reader_module
    from support.graphs import pack_chain

    failure = {"stage": "compile", "exception_type": "RuntimeError", "message": "boom",
               "signature": "compile|RuntimeError|boom", "backend": "eager"}
    path = pack_chain(tmp_path / "a.tar.zst", 6, failure=failure)
    decoded = []
    real = reader_module.decode_index
    monkeypatch.setattr(reader_module, "decode_index", lambda *a, **k: decoded.append(1) or real(*a, **k))
    outcome = reproarchive.run(path, ReplaySettings(backend="eager"))
    assert outcome.status == "passed"  # eager compiles what the recording says failed
    assert not outcome.isolated and len(decoded) == 1
