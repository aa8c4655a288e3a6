"""The hardware catalog (data/hardware/*.json), name resolution and strict validation (the local machine:
test_local_device.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from opcast import hardware
from opcast.errors import OpcastError
from opcast.hardware import (
    DeviceSpec,
    catalog,
    device_name_beside,
    device_to_dict,
    get_device,
    load_device_file,
    read_json_file,
    spec_from_dict,
)
from opcast.paths import data_path, link_problem

PUBLISHED = Path(__file__).resolve().parents[2].parent / "shared" / "published"
NEUSIGHT_CONFIGS = PUBLISHED / "neusight" / "scripts" / "asplos" / "data" / "device_configs"

REQUIRED = [
    "V100-PCIe-32GB",
    "V100-SXM2-32GB",
    "A100-PCIe-40GB",
    "A100-SXM4-40GB",
    "A100-PCIe-80GB",
    "A100-SXM4-80GB",
    "H100-SXM",
    "H100-PCIe",
    "H200",
    "GH200",
    "B200",
    "A40",
    "A10",
    "L4",
    "T4",
    "P100-PCIe-16GB",
    "P4",
    "MI100",
    "MI210",
    "MI250",
    "MI250X",
    "MI300X",
]

MiB, GiB = 2**20, 2**30

# (device, field, value, datasheet). Dense figures are the datasheets' sparsity figures halved.
DATASHEET = [
    ("H100-SXM", "peak_bf16_flops", 989.4e12, "NVIDIA H100 datasheet, SXM: BF16 1979 TFLOPS with sparsity"),
    ("H100-SXM", "peak_fp8_flops", 1978.9e12, "NVIDIA H100 datasheet, SXM: FP8 3958 TFLOPS with sparsity"),
    ("H100-SXM", "peak_tf32_flops", 494.7e12, "NVIDIA H100 datasheet, SXM: TF32 989 TFLOPS with sparsity"),
    ("H100-SXM", "peak_fp32_flops", 66.9e12, "NVIDIA H100 datasheet, SXM: FP32 67 TFLOPS"),
    ("H100-SXM", "mem_bw_bytes_per_s", 3.35e12, "NVIDIA H100 datasheet, SXM: 3.35 TB/s"),
    ("H100-SXM", "sm_count", 132, "NVIDIA H100 whitepaper: H100 SXM5 has 132 SMs"),
    ("H100-SXM", "l2_bytes", 50 * MiB, "NVIDIA H100 whitepaper: 50 MB L2"),
    ("H100-SXM", "intra_node_bw_bytes_per_s", 450e9, "NVIDIA H100 datasheet: NVLink 900 GB/s bidirectional"),
    ("H100-PCIe", "peak_bf16_flops", 756.5e12, "NVIDIA H100 datasheet, PCIe: BF16 1513 TFLOPS with sparsity"),
    ("H200", "mem_bw_bytes_per_s", 4.8e12, "NVIDIA H200 datasheet: 4.8 TB/s"),
    ("H200", "mem_bytes", 141 * GiB, "NVIDIA H200 datasheet: 141 GB HBM3e"),
    ("GH200", "mem_bw_bytes_per_s", 4e12, "NVIDIA GH200 datasheet: 96 GB HBM3 at 4 TB/s"),
    ("B200", "peak_bf16_flops", 2.25e15, "NVIDIA HGX B200: FP16/BF16 36 PFLOPS with sparsity for 8 GPUs"),
    ("B200", "peak_fp8_flops", 4.5e15, "NVIDIA HGX B200: FP8 72 PFLOPS with sparsity for 8 GPUs"),
    ("A100-SXM4-80GB", "peak_bf16_flops", 312e12, "NVIDIA A100 datasheet: BF16 312 TFLOPS (624 with sparsity)"),
    ("A100-SXM4-80GB", "peak_tf32_flops", 156e12, "NVIDIA A100 datasheet: TF32 156 TFLOPS"),
    ("A100-SXM4-80GB", "mem_bw_bytes_per_s", 2.039e12, "NVIDIA A100 datasheet: 80GB SXM 2,039 GB/s"),
    ("A100-PCIe-80GB", "mem_bw_bytes_per_s", 1.935e12, "NVIDIA A100 datasheet: 80GB PCIe 1,935 GB/s"),
    ("A100-PCIe-40GB", "mem_bw_bytes_per_s", 1.555e12, "NVIDIA A100 datasheet: 40GB 1,555 GB/s"),
    ("A100-SXM4-40GB", "intra_node_bw_bytes_per_s", 300e9, "NVIDIA A100 datasheet: NVLink 600 GB/s"),
    ("V100-SXM2-32GB", "peak_fp16_flops", 125e12, "NVIDIA V100 datasheet, SXM2: Tensor 125 TFLOPS"),
    ("V100-PCIe-32GB", "peak_fp32_flops", 14e12, "NVIDIA V100 datasheet, PCIe: FP32 14 TFLOPS"),
    ("A40", "peak_bf16_flops", 149.7e12, "NVIDIA A40 datasheet: BF16 149.7 TFLOPS"),
    ("A10", "peak_fp16_flops", 125e12, "NVIDIA A10 datasheet: FP16 125 TFLOPS"),
    ("L4", "peak_fp8_flops", 242.5e12, "NVIDIA L4 datasheet: FP8 485 TFLOPS with sparsity"),
    ("T4", "peak_fp16_flops", 65e12, "NVIDIA T4 datasheet: mixed precision 65 TFLOPS"),
    ("P100-PCIe-16GB", "mem_bw_bytes_per_s", 732e9, "NVIDIA P100 PCIe datasheet: 732 GB/s"),
    ("MI300X", "peak_bf16_flops", 1307.4e12, "AMD MI300X datasheet: BF16 1307.4 TFLOPS dense"),
    ("MI300X", "mem_bw_bytes_per_s", 5.3e12, "AMD MI300X datasheet: 5.3 TB/s"),
    ("MI210", "peak_fp16_flops", 181e12, "AMD MI210 datasheet: FP16 181.0 TFLOPS"),
    ("MI250X", "peak_bf16_flops", 191.5e12, "AMD MI250X datasheet: BF16 383 TFLOPS per two-GCD module"),
    ("MI100", "peak_bf16_flops", 92.3e12, "AMD MI100 datasheet: BF16 92.3 TFLOPS"),
]


@pytest.fixture
def valid() -> dict:
    """A complete, valid device mapping (H100-SXM renamed)."""
    d = device_to_dict(get_device("H100-SXM"))
    d["name"], d["aliases"] = "my-gpu", ["my gpu spelling"]
    return d


def _write(tmp_path: Path, obj, name: str = "dev.json") -> Path:
    path = tmp_path / name
    path.write_text(obj if isinstance(obj, str) else json.dumps(obj))
    return path


def _one_line_error(fn, *args, **kwargs) -> str:
    with pytest.raises(OpcastError) as info:
        fn(*args, **kwargs)
    message = str(info.value)
    assert "\n" not in message
    return message


# ---------------------------------------------------------------------- catalog files


@pytest.mark.parametrize("path", sorted(data_path("hardware").glob("*.json")), ids=lambda p: p.stem)
def test_every_catalog_file_loads_and_validates(path: Path) -> None:
    spec = load_device_file(path)
    assert spec.name == path.stem
    assert list(json.loads(path.read_text())) == list(device_to_dict(spec))  # all keys, canonical order
    assert "http" in spec.source and spec.notes
    assert spec.vendor in ("nvidia", "amd", "intel")


def test_required_gpus_present() -> None:
    assert set(REQUIRED) <= set(catalog())


def test_names_and_aliases_unique_after_normalising() -> None:
    owner: dict[str, str] = {}
    for spec in catalog().values():
        for label in (spec.name, *spec.aliases):
            key = hardware._normalise(label)
            assert owner.setdefault(key, spec.name) == spec.name, f"{label!r} names {owner[key]} and {spec.name}"


@pytest.mark.parametrize(("device", "field", "value", "cite"), DATASHEET, ids=lambda v: str(v)[:24])
def test_datasheet_numbers(device: str, field: str, value: float, cite: str) -> None:
    assert getattr(get_device(device), field) == pytest.approx(value, rel=1e-3), cite


@pytest.mark.parametrize("spec", list(catalog().values()), ids=lambda s: s.name)
def test_peaks_are_dense_and_consistent(spec: DeviceSpec) -> None:
    # No dense bf16/fp16 of any catalog part exceeds MI355X's 2.52 PFLOPS (GB200/GB300 2.5, B200 2.25);
    # sparse figures (4.5 and up) would. fp8 likewise tops out at MI355X's dense 5.03 PFLOPS.
    for dtype in ("tf32", "fp16", "bf16"):
        assert (getattr(spec, f"peak_{dtype}_flops") or 0) <= 2.6e15
    assert (spec.peak_fp8_flops or 0) <= 5.1e15
    if spec.architecture in ("ampere", "hopper"):
        assert spec.peak_bf16_flops <= 1.0e15  # A100 624 / H100 1979 TFLOPS are sparsity figures
    # tensor peaks are ordered tf32 <= fp16 <= fp8 where present
    chain = [p for p in (spec.peak_tf32_flops, spec.peak_fp16_flops, spec.peak_fp8_flops) if p is not None]
    assert chain == sorted(chain)
    # FP32 peak = 2 FLOP (FMA) x SMs x lanes x boost clock, within 5 % (datasheets round, some quote a lower clock)
    layout = 2 * spec.sm_count * spec.fp32_lanes_per_sm * spec.boost_clock_hz
    assert spec.peak_fp32_flops == pytest.approx(layout, rel=0.05)
    assert spec.intra_node_bw_bytes_per_s <= 1e12 and spec.inter_node_bw_bytes_per_s <= 1e11  # one direction


# ---------------------------------------------------------------------- name resolution


@pytest.mark.parametrize(
    ("spelling", "name"),
    [
        ("NVIDIA H100 80GB HBM3", "H100-SXM"),  # torch.cuda.get_device_name()
        ("Tesla V100-SXM2-32GB", "V100-SXM2-32GB"),
        ("NVIDIA A100 80GB PCIe", "A100-PCIe-80GB"),
        ("AMD Instinct MI300X", "MI300X"),
        ("NVIDIAA100-SXM4-80GB", "A100-SXM4-80GB"),  # estimate-train-time (Perlmutter)
        ("NVIDIAGH200120GB", "GH200"),  # estimate-train-time (Vista)
        ("a100", "A100-SXM4-80GB"),  # vidur
        ("a40", "A40"),
        ("v100", "V100-SXM2-32GB"),
        ("h100 sxm", "H100-SXM"),  # case / separators ignored
        ("NVIDIA L4", "L4"),
        ("nvidia_b200", "B200"),  # vendor prefix optional
    ],
)
def test_spellings_resolve(spelling: str, name: str) -> None:
    assert get_device(spelling).name == name


@pytest.mark.skipif(not NEUSIGHT_CONFIGS.is_dir(), reason=f"published NeuSight data not found at {NEUSIGHT_CONFIGS}")
def test_every_neusight_device_config_resolves() -> None:
    for path in sorted(NEUSIGHT_CONFIGS.glob("*.json")):
        cfg = json.loads(path.read_text())
        spec = get_device(path.stem)
        assert get_device(cfg["Device"]).name == spec.name, path.name
        if not path.stem.endswith("_TP"):  # the _TP config describes two H100s as one device
            # NeuSight's bandwidths are the same datasheet figures within 5 % (H100: 3430 vs 3350 GB/s)
            assert spec.mem_bw_bytes_per_s == pytest.approx(cfg["Mem_Bw"] * 1e9, rel=0.05), path.name


def test_unknown_name_is_one_line_with_the_known_names() -> None:
    message = _one_line_error(get_device, "H100-SXM4-96GB")
    assert "unknown GPU 'H100-SXM4-96GB'" in message and "A100-SXM4-80GB" in message
    assert "opcast hardware list" in message


def test_json_path_loads_a_user_file(tmp_path: Path, valid: dict) -> None:
    path = _write(tmp_path, valid)
    spec = get_device(str(path))
    assert spec.name == "my-gpu" and spec.aliases == ("my gpu spelling",)
    assert "not found" in _one_line_error(get_device, str(tmp_path / "missing.json"))


def test_round_trip_through_json(valid: dict) -> None:
    spec = spec_from_dict(json.loads(json.dumps(valid)), "<test>")
    assert device_to_dict(spec) == valid


# ---------------------------------------------------------------------- strict validation


def test_unknown_key(tmp_path: Path, valid: dict) -> None:
    path = _write(tmp_path, {**valid, "peak_fp64_flops": 1e12})
    message = _one_line_error(load_device_file, path)
    assert str(path) in message and "unknown key 'peak_fp64_flops'" in message


def test_missing_key(tmp_path: Path, valid: dict) -> None:
    del valid["mem_bw_bytes_per_s"]
    path = _write(tmp_path, valid)
    message = _one_line_error(load_device_file, path)
    assert str(path) in message and "missing key 'mem_bw_bytes_per_s'" in message


def test_negative_and_wrong_type_values(tmp_path: Path, valid: dict) -> None:
    path = _write(tmp_path, {**valid, "mem_bw_bytes_per_s": -1.0, "sm_count": 13.5, "peak_fp32_flops": "67e12"})
    message = _one_line_error(load_device_file, path)
    assert str(path) in message
    assert "'mem_bw_bytes_per_s' must be positive" in message
    assert "'sm_count' must be an integer" in message
    assert "'peak_fp32_flops' must be a number" in message


def test_a_rate_below_one_unit_is_refused(tmp_path: Path, valid: dict) -> None:
    # mem_bw 1e-288 bytes/s (--set mem_bw_bytes_per_s=x1e-300) priced kernels at 1e297 s: phase sums overflowed
    # to inf, an 'inf %' share and Infinity in --json
    path = _write(tmp_path, {**valid, "mem_bw_bytes_per_s": 1e-288, "peak_fp32_flops": 0.5})
    message = _one_line_error(load_device_file, path)
    assert "'mem_bw_bytes_per_s' must be at least 1 bytes/s, got 1e-288: no device is that slow" in message
    assert "'peak_fp32_flops' must be at least 1 FLOP/s, got 0.5" in message
    with pytest.raises(OpcastError, match=r"'mem_bw_bytes_per_s' must be at least 1 bytes/s, got 3\.35e-288"):
        get_device("H100-SXM[mem_bw_bytes_per_s=x1e-300]")
    assert spec_from_dict({**valid, "mem_bw_bytes_per_s": 1.0, "tdp_w": 1.0}, "<ok>").mem_bw_bytes_per_s == 1.0


def test_a_memory_below_one_mib_is_refused(tmp_path: Path, valid: dict) -> None:
    # H100-SXM[mem_bytes=1] was taken: hardware show printed it and a prediction said '> ...'s 0 GiB'
    with pytest.raises(OpcastError, match=r"'mem_bytes' must be at least 1 MiB \(1048576 bytes\), got 1: no device"):
        get_device("H100-SXM[mem_bytes=1]")
    with pytest.raises(OpcastError, match=r"'mem_bytes' must be at least 1 MiB \(1048576 bytes\), got 86"):
        get_device("H100-SXM[mem_bytes=x1e-9]")
    assert "'mem_bytes' must be at least 1 MiB" in _one_line_error(
        load_device_file, _write(tmp_path, {**valid, "mem_bytes": 4096})
    )
    assert get_device(f"H100-SXM[mem_bytes={2**20}]").mem_bytes == 2**20


def test_a_factor_past_a_fields_largest_value_is_refused_by_its_bound() -> None:
    # --vary peak_bf16_flops=1e300 said "'peak_bf16_flops' must be a number (FLOP/s), got inf", and
    # H100-SXM[mem_bytes=x1e300] was an internal error (OverflowError in int())
    with pytest.raises(OpcastError, match=r"x1e300\]' \(peak_bf16_flops=x1e\+300\): the factor 1e\+300 takes "):
        get_device("H100-SXM[peak_bf16_flops=x1e300]")
    with pytest.raises(
        OpcastError, match=r"peak_bf16_flops past its largest value .* >= 1\.8e\+308 FLOP/s\); give a f"
    ):
        get_device("H100-SXM[peak_bf16_flops=x1e300]")
    with pytest.raises(
        OpcastError, match=r"mem_bytes past its largest value .*9\.22e\+18 bytes\); give a factor below"
    ):
        get_device("H100-SXM[mem_bytes=x1e300]")
    # the peaks group: the bound of its largest peak (fp8), whichever peak is named
    with pytest.raises(OpcastError, match=r"give a factor below 9\.08e\+292$"):
        get_device("H100-SXM[peak_flops=x1e300]")
    assert get_device("H100-SXM[mem_bytes=x100]").mem_bytes == 100 * 80 * 2**30


def test_a_file_past_the_json_bound_is_refused_unread(tmp_path: Path, valid: dict, monkeypatch) -> None:
    # read to the end before: --gpu /dev/zero held 15 GB within 20 s
    path = _write(tmp_path, valid)
    assert load_device_file(path).name == valid["name"]
    monkeypatch.setattr(hardware, "MAX_JSON_BYTES", path.stat().st_size - 1)
    assert "the device file is larger than" in _one_line_error(load_device_file, path)


def test_a_path_that_is_not_a_regular_file_is_refused_unopened(tmp_path: Path) -> None:
    # opening a FIFO with no writer blocked for ever: hardware show FIFO and arch show FIFO hung
    fifo = tmp_path / "gpu.json"
    os.mkfifo(fifo)
    for args, what in ((["hardware", "show"], "the device file"), (["arch", "show"], "the arch config")):
        done = subprocess.run(
            [sys.executable, "-m", "opcast", *args, str(fifo)], capture_output=True, text=True, timeout=60
        )
        assert (done.returncode, done.stderr.strip()) == (
            2,
            f"opcast: error: {fifo} is not a regular file (a device, pipe or socket); give the path of {what}",
        )
    with pytest.raises(OpcastError, match=r"^/dev/null is not a regular file \(a device, pipe or socket\); give the"):
        read_json_file("/dev/null", "the device file")


def test_a_derived_name_of_too_many_groups_is_refused_by_name() -> None:
    # thousands of groups said 'an input is nested too deeply to read; check the file you passed' (RecursionError)
    assert get_device("H100-SXM" + "[sm_count=x1]" * hardware.MAX_DERIVED_GROUPS).sm_count == 132
    with pytest.raises(OpcastError, match=r"chains 5000 \[\.\.\.\] groups; give its settings in one NAME"):
        get_device("H100-SXM" + "[]" * 5000)


def test_a_device_file_named_in_a_file_is_taken_from_its_folder(tmp_path: Path) -> None:
    # a cluster file's gpu "mine.json" was looked up in the working directory, not beside the cluster file
    folder = tmp_path / "c"
    (folder / "sub").mkdir(parents=True)
    (folder / "sub" / "x").write_text("{}")
    assert device_name_beside("mine.json", folder) == str(folder / "mine.json")
    assert device_name_beside("sub/x", folder) == str(folder / "sub" / "x")
    assert device_name_beside("mine.json[peak_flops=x2][mem_bytes=x2]", folder) == (
        str(folder / "mine.json") + "[peak_flops=x2][mem_bytes=x2]"
    )
    for name in ("H100-SXM", "H100-SXM[mem_bw_bytes_per_s=x2]", "cuda:0", str(tmp_path / "abs.json"), "no/such"):
        assert device_name_beside(name, folder) == name


def test_a_derived_name_is_named_in_its_errors_not_set() -> None:
    # the user wrote a name, not --set: the messages said "--set 'sm_count=x3'"
    with pytest.raises(OpcastError, match=r"^GPU 'H100-SXM\[sm_count=x2,sm_count=x3\]' \(sm_count=x3\): sm_count is"):
        get_device("H100-SXM[sm_count=x2,sm_count=x3]")
    with pytest.raises(OpcastError, match=r"^GPU 'A100-SXM4-80GB\[peak_fp8_flops=x2\]' \(peak_fp8_flops=x2\): A100"):
        get_device("A100-SXM4-80GB[peak_fp8_flops=x2]")


def test_a_link_that_leads_nowhere_is_named(tmp_path: Path) -> None:
    (tmp_path / "a.json").symlink_to("b.json")
    (tmp_path / "b.json").symlink_to("a.json")
    (tmp_path / "gone.json").symlink_to("nowhere.json")
    assert link_problem(tmp_path / "a.json") == "is a loop of symbolic links"
    assert link_problem(tmp_path / "gone.json") == "is a symbolic link to 'nowhere.json', which does not exist"
    assert link_problem(tmp_path / "absent.json") is None
    with pytest.raises(OpcastError, match=r"device file '.*a\.json' is a loop of symbolic links; give a catalog"):
        get_device(str(tmp_path / "a.json"))
    with pytest.raises(OpcastError, match=r"gone\.json is a symbolic link to 'nowhere\.json'"):
        read_json_file(tmp_path / "gone.json", "the device file")


def test_null_only_where_allowed(tmp_path: Path, valid: dict) -> None:
    assert spec_from_dict({**valid, "peak_fp8_flops": None, "tdp_w": None}, "<ok>").peak_fp8_flops is None
    message = _one_line_error(load_device_file, _write(tmp_path, {**valid, "peak_fp32_flops": None}))
    assert "'peak_fp32_flops' must not be null" in message


def test_bad_json(tmp_path: Path) -> None:
    path = _write(tmp_path, '{"name": "x",, }')
    message = _one_line_error(load_device_file, path)
    assert str(path) in message and "not valid JSON" in message and "line 1" in message


def test_not_an_object(tmp_path: Path) -> None:
    assert "expected a JSON object" in _one_line_error(load_device_file, _write(tmp_path, "[1, 2]"))


@pytest.mark.parametrize(
    "content,needle",
    [
        (b"", "is empty"),
        (b"\x00\xff\xfe" * 100, "not UTF-8 text (byte 0xff at offset 1)"),
        ('{"notes": "\xe9"}'.encode("latin-1"), "not UTF-8 text"),
        (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
        (b'{"name": ' * 50_000 + b"1" + b"}" * 50_000, "nested too deeply"),
        (b'"H100"', "expected a JSON object"),
        (b'{"mem_bytes": 1' + b"0" * 5000 + b"}", "holds an integer of more than 4300 digits"),
        (b'{"name": "X", "mem_bw_bytes_per_s": 1e12, "mem_bw_bytes_per_s": 2e12}', "the key 'mem_bw_bytes_per_s' more"),
        (b'{"name": "X", "extra": {"a": 1, "a": 2}}', "the key 'a' more than once"),
    ],
)
def test_a_malformed_device_file_is_one_line_naming_it(tmp_path: Path, content: bytes, needle: str) -> None:
    path = tmp_path / "gpu.json"
    path.write_bytes(content)
    for load in (load_device_file, get_device):
        message = _one_line_error(load, str(path))
        assert message.startswith(str(path)) and needle in message


@pytest.mark.parametrize(
    "key,value",
    [
        ("peak_bf16_flops", {"dense": 1e15}),
        ("mem_bytes", [80]),
        ("sm_count", True),
        ("mem_bw_bytes_per_s", "3.35e12"),
        ("boost_clock_hz", float("nan")),
        ("aliases", "h100"),
        ("vendor", ["nvidia"]),
        ("notes", 3),
    ],
)
def test_a_wrong_type_names_the_key(tmp_path: Path, valid: dict, key: str, value: object) -> None:
    path = _write(tmp_path, {**valid, key: value})
    message = _one_line_error(get_device, str(path))
    assert str(path) in message and f"'{key}'" in message


@pytest.mark.parametrize(
    "key,value,needle",
    [
        ("mem_bytes", 10**400, "'mem_bytes' is too large, got an integer past 1.8e308: give an integer below 2**63"),
        ("sm_count", 10**30, "'sm_count' is too large, got 1e+30: give an integer below 2**63"),
        ("mem_bw_bytes_per_s", 10**400, "'mem_bw_bytes_per_s' must be a number (bytes/s), got an integer past 1.8e308"),
    ],
)
def test_a_number_too_large_for_the_arithmetic_is_refused(tmp_path: Path, valid: dict, key, value, needle) -> None:
    # an integer past int64 (or past a float) loaded and then overflowed the first division of a prediction
    path = _write(tmp_path, {**valid, key: value})
    message = _one_line_error(get_device, str(path))
    assert str(path) in message and needle in message
    assert spec_from_dict({**valid, "mem_bytes": 2**63 - 1}, "<ok>").mem_bytes == 2**63 - 1


def test_a_folder_is_not_a_device_file(tmp_path: Path) -> None:
    message = _one_line_error(get_device, str(tmp_path))
    assert str(tmp_path) in message and "is a folder" in message


def test_catalog_rejects_duplicate_aliases_and_misnamed_files(tmp_path: Path, valid: dict, monkeypatch) -> None:
    folder = tmp_path / "hardware"
    folder.mkdir()
    monkeypatch.setattr(hardware, "data_path", lambda *parts: tmp_path.joinpath(*parts))
    hardware._load_catalog.cache_clear()
    try:
        _write(folder, valid, "my-gpu.json")
        _write(folder, {**valid, "name": "other-gpu", "aliases": ["MY_GPU_SPELLING"]}, "other-gpu.json")
        message = _one_line_error(catalog)
        assert "alias 'MY_GPU_SPELLING' also names my-gpu" in message
        (folder / "other-gpu.json").unlink()
        _write(folder, {**valid, "name": "third", "aliases": []}, "wrong-name.json")
        assert "differs from the file name" in _one_line_error(catalog)
    finally:
        hardware._load_catalog.cache_clear()


# ---------------------------------------------------------------------- peaks


def test_peak_flops_and_supports() -> None:
    h100, v100 = get_device("H100-SXM"), get_device("V100-SXM2-32GB")
    assert h100.peak_flops("bf16") == 989.4e12
    assert h100.peak_flops("fp32", tensor_cores=False) == 66.9e12
    assert h100.peak_flops("fp32") == h100.peak_tf32_flops  # fp32 matmul allowed onto tensor cores = TF32
    assert h100.peak_flops("fp16", tensor_cores=False) == 66.9e12
    assert v100.peak_flops("fp32") == v100.peak_fp32_flops  # no TF32 on Volta
    assert v100.supports("fp16") and not v100.supports("bf16")
    assert v100.supported_dtypes() == ("fp32", "fp16")
    message = _one_line_error(v100.peak_flops, "bf16")
    assert message == "V100-SXM2-32GB has no bf16 peak; use one of fp32, fp16"
    assert "unknown dtype 'fp64'" in _one_line_error(h100.peak_flops, "fp64")
    assert h100.ridge_point == pytest.approx(989.4e12 / 3.35e12)


def test_direct_construction_is_validated(valid: dict) -> None:
    fields = {**valid, "aliases": tuple(valid["aliases"]), "gpus_per_node": 0}
    assert "'gpus_per_node' must be positive" in _one_line_error(DeviceSpec, **fields)


def test_a_gpu_placed_on_another_network_keeps_its_kernels():
    # --cluster / --set changing only links or GPUs per node leave the kernels the catalog GPU's own
    from opcast.hardware import derive_device, kernel_twin

    h100 = get_device("H100-SXM")
    assert kernel_twin(h100) == "H100-SXM"
    assert kernel_twin(derive_device(h100, ["inter_node_bw_bytes_per_s=25e9", "gpus_per_node=4"])) == "H100-SXM"
    faster = derive_device(h100, ["mem_bw_bytes_per_s=x2"])
    assert kernel_twin(faster) == faster.name != "H100-SXM"


def test_a_gpu_with_more_memory_keeps_its_kernels():
    # the capacity decides what fits; no kernel reads it. A100-SXM4-80GB[mem_bytes=x2] was answered by the
    # bounds of an unseen device, its elementwise kernels (learned on A100-SXM4-80GB, A40, GH200) up to 7 % slower
    from opcast.hardware import derive_device, kernel_twin
    from opcast.predict.cost import kernel, load_kernel_cost

    a100 = get_device("A100-SXM4-80GB")
    bigger = derive_device(a100, ["mem_bytes=x2"])
    assert kernel_twin(bigger) == "A100-SXM4-80GB"
    assert kernel_twin(derive_device(a100, ["mem_bytes=x2", "l2_bytes=x2"])) != "A100-SXM4-80GB"
    cost = load_kernel_cost(None)
    for k in (
        kernel("elementwise", {"numel": 1 << 23, "fn": "add"}, "bf16"),
        kernel("gemm", {"b": 1, "m": 4096, "n": 4096, "k": 4096}, "bf16"),
    ):
        assert cost.time_s(k, bigger)[0] == cost.time_s(k, a100)[0], k
