"""A workspace's settings (``config.json``, guard/config.py): a setting that is not valid is
refused in words that name the file and the setting, and say where an override came from."""

from __future__ import annotations

import json
import re

import pytest

from guard.config import GuardConfig


def test_a_setting_out_of_range_names_the_file_and_the_setting(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"spare_workers_gpu": 0, "noise_floor": 0.02}))
    with pytest.raises(ValueError) as caught:
        GuardConfig.load(path)
    assert str(caught.value) == f"{path}: spare_workers_gpu: Input should be greater than or equal to 1"
    path.write_text(json.dumps({"noise_floor": 0.02}))
    assert GuardConfig.load(path).noise_floor == 0.02


def test_an_override_that_is_not_valid_says_it_was_not_in_the_file(tmp_path):
    path = tmp_path / "config.json"
    path.write_text("{}")
    with pytest.raises(ValueError, match=r"noise_sigmas: .* \(given as an override, not in the file\)"):
        GuardConfig.load(path, noise_sigmas=-1.0)
    with pytest.raises(ValueError, match=r"no_such_setting: Extra inputs are not permitted"):
        GuardConfig.load(path, no_such_setting=1)


@pytest.mark.parametrize(
    ("text", "says"), [("{not json", "not valid JSON"), ("[1, 2]", "should hold one JSON object of settings, not list")]
)
def test_a_file_that_is_no_settings_object_is_refused_with_its_path(tmp_path, text, says):
    path = tmp_path / "config.json"
    path.write_text(text)
    with pytest.raises(ValueError, match="^" + re.escape(f"{path}: {says}")):
        GuardConfig.load(path)


def test_the_command_line_says_which_setting_of_which_file(tmp_path):
    from helpers import RMS, kernelarc

    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "config.json").write_text(json.dumps({"spare_workers_gpu": 0}))
    seed = tmp_path / "k.py"
    seed.write_text("def run(hidden_states, weight):\n    return hidden_states\n")
    done = kernelarc(ws, "submit", "--problem", RMS, str(seed), "-q", check=False)
    assert done.returncode != 0
    assert f"{ws / 'config.json'}: spare_workers_gpu: Input should be greater than or equal to 1" in done.stderr
    assert "errors.pydantic.dev" not in done.stderr
