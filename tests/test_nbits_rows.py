"""tools/nbits_rows.py: the table it prints has one row per setting and the ratios of a real measurement."""

import numpy as np


def test_quantized_session_matches_float_matmul(tool):
    rows = tool("nbits_rows")
    sess = rows.session(64, 48, bits=8, block_size=32, threads=1)
    weight = (np.random.default_rng(0).standard_normal((64, 48)) * 0.02).astype(np.float32)
    x = np.random.default_rng(2).standard_normal((1, 3, 64)).astype(np.float32)
    (y,) = sess.run(None, {"x": x})
    assert y.shape == (1, 3, 48)
    assert np.abs(y - x @ weight).max() < 0.02  # 8-bit blocks: close to the float product, not equal


def test_table_has_a_row_per_setting(tool, capsys):
    rows = tool("nbits_rows")
    assert rows.main(["--shapes", "64x32", "--block-sizes", "32,64", "--threads", "1", "--rows", "1,3",
                      "--rounds", "1", "--calls", "2"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].startswith("| weight | bits | block | threads | M=1 ms | M=3 / M=1")
    assert [line.split("|")[3].strip() for line in lines[2:]] == ["32", "64"]
    assert all(float(line.split("|")[6].strip().rstrip("x")) > 0 for line in lines[2:])
