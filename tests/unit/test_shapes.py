import pytest

from gateway.domain.shapes import (
    format_duration,
    format_memory,
    normalise_gpu_type,
    parse_duration_s,
    parse_memory_mib,
)


@pytest.mark.parametrize("value,mib", [("64Gi", 65536), ("64G", 65536), ("512Mi", 512), ("1Ti", 1048576),
                                       (2048, 2048), ("2048", 2048), ("16384K", 16)])
def test_memory(value, mib):
    assert parse_memory_mib(value) == mib


@pytest.mark.parametrize("value", ["1.5G", "abc", "", "1Pi", True, 1.5, "8Ki"])
def test_memory_rejects(value):
    with pytest.raises(ValueError):
        parse_memory_mib(value)


@pytest.mark.parametrize("value,s", [(90, 90), ("90m", 5400), ("2h", 7200), ("1d", 86400),
                                     ("01:30:00", 5400), ("1-00:00:00", 86400), ("3600", 3600)])
def test_duration(value, s):
    assert parse_duration_s(value) == s


def test_formats_round_trip():
    assert format_memory(65536) == "64Gi" and format_memory(1536) == "1536Mi"
    assert format_duration(93784) == "1-02:03:04"
    assert parse_duration_s(format_duration(93784)) == 93784


def test_gpu_types_compare_in_lower_case():
    assert normalise_gpu_type("NVIDIA-H100-80GB-HBM3") == "nvidia-h100-80gb-hbm3"
    assert normalise_gpu_type(None) is None and normalise_gpu_type("") == ""
