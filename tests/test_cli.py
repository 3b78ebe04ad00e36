"""The portable-softmax command: the demo checks itself; files in, files out; bad files fail clearly."""

from __future__ import annotations

import numpy as np
import pytest
from checks import assert_matches

from portable_softmax.cli import main


def test_demo_checks_against_the_reference(capsys):
    assert main(["run"]) == 0
    err = capsys.readouterr().err
    assert "within atol 1e-06, rtol 1e-05" in err
    for step in ("read", "runtime init", "compute", "write", "total"):
        assert step in err


def test_text_in_text_out(tmp_path, rng):
    x = rng.standard_normal((5, 7)).astype(np.float32)
    src = tmp_path / "in.txt"
    np.savetxt(src, x)
    out = tmp_path / "out.txt"
    assert main(["run", str(src), "-o", str(out), "--axis", "0"]) == 0
    assert_matches(np.loadtxt(out).astype(np.float32), np.loadtxt(src).astype(np.float32), axis=0)


def test_npy_in_npy_out_log(tmp_path, rng):
    x = rng.standard_normal((3, 4, 5)).astype(np.float64)
    np.save(tmp_path / "in.npy", x)
    assert main(["run", str(tmp_path / "in.npy"), "-o", str(tmp_path / "out.npy"), "--log", "--axis", "1"]) == 0
    assert_matches(np.load(tmp_path / "out.npy"), x, axis=1, op="log_softmax")


def test_stdout_when_no_output_file(tmp_path, capsys):
    (tmp_path / "in.txt").write_text("0 0\n")
    assert main(["run", str(tmp_path / "in.txt")]) == 0
    assert capsys.readouterr().out.split() == ["0.5", "0.5"]


@pytest.mark.parametrize(
    "content, message",
    [(None, "no such file"), (b"", "the file is empty"), (b"1 2\n3 x\n", "cannot parse"), (b"\n\n", "no numbers")],
)
def test_bad_text_files_fail_with_a_clear_error(tmp_path, capsys, content, message):
    path = tmp_path / "in.txt"
    if content is not None:
        path.write_bytes(content)
    assert main(["run", str(path)]) == 2
    assert message in capsys.readouterr().err


def test_corrupt_npy_fails_with_a_clear_error(tmp_path, capsys):
    (tmp_path / "bad.npy").write_bytes(b"\x93NUMPY garbage")
    assert main(["run", str(tmp_path / "bad.npy")]) == 2
    assert "not a readable .npy file" in capsys.readouterr().err


def test_integer_npy_names_the_supported_dtypes(tmp_path, capsys):
    np.save(tmp_path / "ints.npy", np.arange(6).reshape(2, 3))
    assert main(["run", str(tmp_path / "ints.npy")]) == 2
    assert "Supported dtypes: float32" in capsys.readouterr().err


def test_info_reports_the_backend(capsys):
    assert main(["info"]) == 0
    assert "backend" in capsys.readouterr().out
