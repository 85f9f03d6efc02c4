"""Run-directory files: a corrupt ``metrics.jsonl`` is refused with a trustfl error naming the file and line."""
import pytest

from trustfl.core.runfiles import read_metrics
from trustfl.errors import TrustFLError, UsageError


def test_read_metrics_refuses_a_corrupt_file(tmp_path):
    assert read_metrics(tmp_path) == []  # no file: no rows
    (tmp_path / "metrics.jsonl").write_text('{"round": 1}\nnot json\n')
    with pytest.raises(UsageError, match=r"metrics.jsonl is not a trustfl metrics file \(line 2") as info:
        read_metrics(tmp_path)
    assert isinstance(info.value, TrustFLError)
