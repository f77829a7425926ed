"""Cluster specs: the presets carry the numbers of docs/reference-numbers.md, ranks are
placed on nodes in order, ``describe()`` says what the cluster is, custom clusters come
from a dict or a YAML file, and every mistake in a description is a ``ValueError`` that
names the field."""

from pathlib import Path

import pytest
import torch
import torch.distributed as dist

import simcluster as sc
from simcluster import spec

GB, GiB, TFLOPS = 1e9, 2**30, 1e12
EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "cluster.yaml"


# ================================================================== presets
def test_dgx_a100_has_the_reference_numbers():
    s = spec.preset("dgx-a100")
    assert s.name == "dgx-a100" and len(s.nodes) == 1 and s.world_size == 8
    node = s.nodes[0]
    assert node.devices == 8 and node.nics == 8
    d = node.device
    assert d.memory == 80 * GiB
    assert d.peak_flops["bfloat16"] == 312 * TFLOPS
    assert d.peak_flops["float16"] == 312 * TFLOPS
    assert d.peak_flops["float32"] == 19.5 * TFLOPS
    assert d.peak_flops["tf32"] == 156 * TFLOPS
    assert d.hbm_bandwidth == 2039 * GB
    assert node.fabric.bandwidth == 300 * GB and node.fabric.efficiency == 0.8
    assert node.fabric.pair_bandwidth is None    # NVSwitch: any pair at full bandwidth
    # NCCL 2.30.7 tuning.cc, a Simple ring step: 3.4 us over NVLink, 14 us over the network
    assert node.fabric.latency == pytest.approx(3.4e-6)
    assert (node.cpu, d.compute_capability) == ("amd", 8.0)   # AMD EPYC 7742 hosts
    nic = s.network.nic
    assert nic.bandwidth == 25 * GB and nic.efficiency == 0.95  # HDR 200 Gb/s
    assert nic.latency == pytest.approx(14.0e-6) and nic.kind == "net"
    assert s.network.oversubscription == 1


def test_dgx_h100_has_the_reference_numbers():
    s = spec.preset("dgx-h100", nodes=2)
    assert s.world_size == 16 and all(n.devices == 8 for n in s.nodes)
    d = s.nodes[0].device
    assert d.memory == 80 * GiB
    assert d.peak_flops["bfloat16"] == 989 * TFLOPS
    assert d.hbm_bandwidth == 3350 * GB
    assert s.nodes[0].fabric.bandwidth == 450 * GB
    assert s.network.nic.bandwidth == 50 * GB  # NDR 400 Gb/s
    assert all(n.nics == 8 and n.cpu == "intel" for n in s.nodes)  # Xeon 8480C hosts
    assert d.compute_capability == 9.0


@pytest.mark.parametrize("nodes", [1, 2, 4, 128])
def test_dgx_presets_scale_with_nodes(nodes):
    s = spec.preset("dgx-a100", nodes=nodes)
    assert len(s.nodes) == nodes and s.world_size == 8 * nodes
    assert len({n.name for n in s.nodes}) == nodes


def test_hetero_11_has_11_nodes_and_node_7_has_8_gpus():
    s = spec.preset("hetero-11")
    assert s.name == "hetero-11" and len(s.nodes) == 11 and s.world_size == 48
    assert [n.devices for n in s.nodes] == [4] * 7 + [8] + [4] * 3
    assert all(n.device.name == "A100-80GB" and n.device.memory == 80 * GiB for n in s.nodes)
    assert all(n.fabric.name.startswith("NVLink") for n in s.nodes)
    # the 4-GPU nodes are HGX A100 4-GPU boards: an NVLink mesh, 4 links (100 GB/s) a pair
    small = [n for n in s.nodes if n.devices == 4]
    assert all(n.fabric.pair_bandwidth == 100 * GB and n.fabric.bandwidth == 300 * GB
               and n.nics == 4 for n in small)
    assert s.nodes[7].fabric.pair_bandwidth is None and s.nodes[7].nics == 8
    assert spec.preset("hetero-11", nodes=11).world_size == 48
    with pytest.raises(ValueError, match="always has 11 nodes"):
        spec.preset("hetero-11", nodes=4)


def test_cluster_preset_wraps_the_spec():
    c = sc.Cluster.preset("hetero-11")
    assert c.world_size == 48 and c.spec == spec.preset("hetero-11")
    assert repr(c) == "<Cluster hetero-11: 11 nodes, 48 devices>"
    assert set(sc.PRESETS) >= {"dgx-a100", "dgx-h100", "hetero-11"}


def test_cluster_accepts_a_preset_name():
    assert sc.Cluster("dgx-h100").spec == spec.preset("dgx-h100")
    with pytest.raises(ValueError, match="unknown cluster preset 'dgx-a10'"):
        sc.Cluster("dgx-a10")


@pytest.mark.parametrize("name, nodes, match", [
    ("dgx-b200", None, r"unknown cluster preset 'dgx-b200'; choose one of dgx-a100, "
                       r"dgx-h100, hetero-11"),
    (None, None, "unknown cluster preset None"),
    ("dgx-a100", 0, "nodes must be a positive integer, got 0"),
    ("dgx-a100", -2, "nodes must be a positive integer, got -2"),
    ("dgx-a100", 1.5, "nodes must be a positive integer, got 1.5"),
    ("dgx-a100", True, "nodes must be a positive integer, got True"),
])
def test_bad_preset_arguments(name, nodes, match):
    with pytest.raises(ValueError, match=match):
        sc.Cluster.preset(name, nodes=nodes)


# ================================================================ placement
@pytest.mark.parametrize("rank, where", [(0, (0, 0)), (7, (0, 7)), (8, (1, 0)),
                                         (15, (1, 7)), (31, (3, 7))])
def test_placement_fills_dgx_nodes_in_order(rank, where):
    s = spec.preset("dgx-a100", nodes=4)
    assert s.placement(rank) == where
    assert s.node_of(rank) == where[0]
    assert s.device_of(rank) is s.nodes[where[0]].device


@pytest.mark.parametrize("rank, where", [(0, (0, 0)), (3, (0, 3)), (4, (1, 0)),
                                         (27, (6, 3)), (28, (7, 0)), (35, (7, 7)),
                                         (36, (8, 0)), (47, (10, 3))])
def test_placement_on_hetero_11(rank, where):
    assert spec.preset("hetero-11").placement(rank) == where


def test_links_between_ranks():
    s = spec.preset("dgx-a100", nodes=2)
    assert s.link_between(0, 7) is s.nodes[0].fabric
    assert s.link_between(8, 15) is s.nodes[1].fabric
    assert s.link_between(7, 8) == s.inter_node_link
    assert s.link_between(7, 8).bandwidth == 25 * GB


def test_placement_of_a_negative_rank():
    with pytest.raises(ValueError, match="rank -1 is negative"):
        spec.preset("dgx-a100").placement(-1)


def test_placement_out_of_range_is_an_error():
    with pytest.raises(ValueError, match="out of range for dgx-a100 \\(8 devices\\)"):
        spec.preset("dgx-a100").placement(8)


def test_placement_out_of_range_names_the_rank():
    with pytest.raises(ValueError, match="rank 9 is out of range"):
        spec.preset("dgx-a100").placement(9)


# ================================================================= describe
def test_describe_dgx_a100():
    text = spec.preset("dgx-a100", nodes=2).describe()
    lines = text.splitlines()
    assert lines[0] == "dgx-a100: 2 node(s), 16 devices"
    assert lines[1] == ("  nodes 0-1: 8 x A100-80GB (80 GiB, 312 TFLOP/s bf16, 2,039 GB/s HBM), "
                        "NVLink3/NVSwitch 300 GB/s per direction, 8 NIC(s)")
    assert lines[2] == ("  network: HDR InfiniBand 200 Gb/s 25 GB/s per NIC, latency 14.0 µs, "
                        "oversubscription 1:1")
    assert len(lines) == 3


def test_describe_groups_hetero_11_around_node_7():
    lines = spec.preset("hetero-11").describe().splitlines()
    assert lines[0] == "hetero-11: 11 node(s), 48 devices"
    assert lines[1].startswith("  nodes 0-6: 4 x A100-80GB") and lines[1].endswith("4 NIC(s)")
    assert lines[2].startswith("  node 7: 8 x A100-80GB") and lines[2].endswith("8 NIC(s)")
    assert lines[3].startswith("  nodes 8-10: 4 x A100-80GB")
    assert lines[4].startswith("  network: HDR InfiniBand")


def test_describe_h100_and_cluster_describe_prints(capsys):
    c = sc.Cluster.preset("dgx-h100")
    assert c.describe() is None
    out = capsys.readouterr().out
    assert out == c.spec.describe() + "\n"
    assert "8 x H100-80GB (80 GiB, 989 TFLOP/s bf16, 3,350 GB/s HBM)" in out
    assert "NVLink4/NVSwitch 450 GB/s per direction" in out
    assert "NDR InfiniBand 400 Gb/s 50 GB/s per NIC" in out


# =========================================================== custom clusters
def test_from_dict_with_defaults_is_dgx_a100_like():
    c = sc.Cluster.from_dict({"nodes": [{"devices": 4, "count": 3}]})
    s = c.spec
    assert s.name == "custom" and c.world_size == 12 and len(s.nodes) == 3
    assert all(n.device == spec.A100_80GB and n.fabric == spec.NVLINK3 and n.nics == 4
               for n in s.nodes)
    assert s.network.nic == spec.HDR_IB and s.network.oversubscription == 1
    assert [n.name for n in s.nodes] == ["node0", "node1", "node2"]
    assert s.placement(5) == (1, 1)


def test_from_dict_with_custom_device_links_and_network():
    s = sc.Cluster.from_dict({
        "name": "mine",
        "nodes": [{"devices": 2, "device": "H100-80GB", "fabric": "nvlink4", "nics": 1},
                  {"devices": 4, "nics": 2,
                   "device": {"name": "toy", "memory_gb": 16,
                              "peak_tflops": {"float32": 10, "bfloat16": 100},
                              "hbm_gbps": 900},
                   "fabric": {"name": "pcie", "bandwidth_gbps": 32, "latency_us": 5,
                              "efficiency": 0.5}}],
        "network": {"nic": {"name": "eth", "bandwidth_gbps": 12.5, "latency_us": 20},
                    "oversubscription": 4},
    }).spec
    assert s.name == "mine" and s.world_size == 6
    assert s.nodes[0].device == spec.H100_80GB and s.nodes[0].fabric == spec.NVLINK4
    toy = s.nodes[1].device
    assert toy.name == "toy" and toy.memory == 16 * GiB and toy.hbm_bandwidth == 900 * GB
    assert toy.peak_flops == {"float32": 10 * TFLOPS, "bfloat16": 100 * TFLOPS}
    pcie = s.nodes[1].fabric
    assert pcie.bandwidth == 32 * GB and pcie.latency == pytest.approx(5e-6)
    assert pcie.effective_bandwidth == 16 * GB
    assert s.network.nic.latency == pytest.approx(20e-6)
    assert s.inter_node_link.bandwidth == 12.5 * GB / 4  # oversubscription 4:1
    assert s.link_between(2, 3) is pcie and s.link_between(0, 1) == spec.NVLINK4
    assert s.link_between(1, 2) == s.inter_node_link
    assert "2 x H100-80GB" in s.describe() and "4 x toy (16 GiB, 100 TFLOP/s bf16" in s.describe()


def test_from_dict_with_a_mesh_fabric_cpu_and_compute_capability():
    """The fields NCCL's model reads: a mesh's per-pair bandwidth, the link kind (which of
    NCCL's hop latencies apply), the host CPU vendor and the GPU's compute capability."""
    s = sc.Cluster.from_dict({"nodes": [
        {"devices": 4, "fabric": "nvlink3-mesh4", "cpu": "intel"},
        {"devices": 4, "device": {"memory_gb": 48, "peak_tflops": {"float32": 91.6},
                                  "hbm_gbps": 864, "compute_capability": 8.9},
         "fabric": {"bandwidth_gbps": 32, "kind": "pci", "pair_bandwidth_gbps": 16}}],
        "network": {"nic": {"bandwidth_gbps": 50}}}).spec
    assert s.nodes[0].fabric == spec.NVLINK3_MESH4 and s.nodes[0].cpu == "intel"
    assert s.nodes[1].cpu == "amd" and s.nodes[1].device.compute_capability == 8.9
    pcie = s.nodes[1].fabric
    assert (pcie.kind, pcie.pair_bandwidth) == ("pci", 16 * GB)
    assert s.network.nic.kind == "net"
    # a pair of GPUs gets one pair's links; all four of the mesh get their full bandwidth
    mesh = spec.NVLINK3_MESH4
    assert mesh.effective_bandwidth_among(2) == pytest.approx(100 * GB * 0.8)
    assert mesh.effective_bandwidth_among(3) == pytest.approx(200 * GB * 0.8)
    assert mesh.effective_bandwidth_among(4) == pytest.approx(300 * GB * 0.8)
    assert spec.NVLINK3.effective_bandwidth_among(2) == pytest.approx(300 * GB * 0.8)
    assert "(100 GB/s per pair)" in s.describe()


def test_from_yaml_example_file():
    c = sc.Cluster.from_yaml(str(EXAMPLE))
    s = c.spec
    assert s.name == "lab-cluster"
    assert [n.devices for n in s.nodes] == [4, 4, 8] and c.world_size == 16
    assert [n.nics for n in s.nodes] == [4, 4, 2]
    assert s.nodes[0].device == spec.A100_80GB and s.nodes[1].fabric == spec.NVLINK3
    l40s = s.nodes[2].device
    assert l40s.name == "L40S-48GB" and l40s.memory == 48 * GiB
    assert l40s.peak_flops["bfloat16"] == 362 * TFLOPS and l40s.hbm_bandwidth == 864 * GB
    assert s.nodes[2].fabric.bandwidth == 32 * GB and s.nodes[2].fabric.efficiency == 0.8
    assert s.nodes[2].fabric.kind == "pci" and l40s.compute_capability == 8.9
    assert s.network.nic == spec.HDR_IB and s.network.oversubscription == 2
    assert s.inter_node_link.bandwidth == 12.5 * GB
    assert s.placement(7) == (1, 3) and s.placement(8) == (2, 0)
    assert c.spec.describe().splitlines()[0] == "lab-cluster: 3 node(s), 16 devices"
    # and it is the same as the dict it spells out
    import yaml
    assert sc.Cluster.from_dict(yaml.safe_load(EXAMPLE.read_text())).spec == s


def _all_reduce_ones():
    t = torch.ones(4)
    dist.all_reduce(t)
    return t[0].item()


def test_a_custom_cluster_runs_across_its_nodes():
    c = sc.Cluster.from_yaml(EXAMPLE)  # a Path works too
    run = c.run(_all_reduce_ones, world_size=16)
    assert run.results == [16.0] * 16
    assert run.elapsed > 0


def test_from_yaml_of_an_empty_file(tmp_path):
    path = tmp_path / "empty.yaml"
    path.write_text("")
    with pytest.raises(ValueError, match="a cluster description must be a dict, got NoneType"):
        sc.Cluster.from_yaml(path)


# ================================================================ validation
def _nodes(**fields):
    return {"nodes": [{"devices": 4, **fields}]}


def _device(**fields):
    d = {"memory_gb": 16, "peak_tflops": {"float32": 10, "bfloat16": 100}, "hbm_gbps": 900}
    d.update(fields)
    return _nodes(device=d)


@pytest.mark.parametrize("description, match", [
    ([], "a cluster description must be a dict, got list"),
    ({}, "nodes must be a non-empty list"),
    ({"nodes": []}, "nodes must be a non-empty list"),
    ({"nodes": ["dgx"]}, r"nodes\[0\] must be a dict"),
    # zero / missing / wrong devices
    (_nodes(devices=0), r"nodes\[0\]: devices must be a positive integer, got 0"),
    ({"nodes": [{"count": 2}]}, r"nodes\[0\]: devices must be a positive integer, got None"),
    (_nodes(devices=2.5), r"nodes\[0\]: devices must be a positive integer, got 2.5"),
    (_nodes(devices=True), r"nodes\[0\]: devices must be a positive integer, got True"),
    (_nodes(count=0), r"nodes\[0\]: count must be a positive integer, got 0"),
    (_nodes(nics=-1), r"nodes\[0\]: nics must be a non-negative integer, got -1"),
    # negative / zero bandwidths and latencies
    (_nodes(fabric={"bandwidth_gbps": -300}),
     r"nodes\[0\]: bandwidth_gbps must be a positive number, got -300"),
    (_nodes(fabric={"bandwidth_gbps": 0}),
     r"nodes\[0\]: bandwidth_gbps must be a positive number, got 0"),
    (_nodes(fabric={"latency_us": 3}),
     r"nodes\[0\]: bandwidth_gbps must be a positive number, got None"),
    (_nodes(fabric={"bandwidth_gbps": 300, "latency_us": -1}),
     r"nodes\[0\]: latency_us must be a non-negative number, got -1"),
    (_nodes(fabric={"bandwidth_gbps": 300, "efficiency": 1.5}),
     r"nodes\[0\]: efficiency must be in \(0, 1\], got 1.5"),
    (_nodes(fabric={"bandwidth_gbps": 300, "efficiency": 0}),
     r"nodes\[0\]: efficiency must be in \(0, 1\], got 0"),
    (_nodes(fabric={"bandwidth_gbps": 300, "efficiency": True}),
     r"nodes\[0\]: efficiency must be in \(0, 1\], got True"),
    ({"nodes": [{"devices": 4}], "network": {"nic": {"bandwidth_gbps": -25}}},
     "network: bandwidth_gbps must be a positive number, got -25"),
    (_device(hbm_gbps=-1), r"nodes\[0\]: hbm_gbps must be a positive number, got -1"),
    (_device(compute_capability=0),
     r"nodes\[0\]: compute_capability must be a positive number, got 0"),
    (_nodes(cpu="arm"), r"nodes\[0\]: cpu must be one of amd, intel, got 'arm'"),
    (_nodes(fabric={"bandwidth_gbps": 300, "kind": "nvswitch"}),
     r"nodes\[0\]: kind must be one of nvlink, pci, net, got 'nvswitch'"),
    (_nodes(fabric={"bandwidth_gbps": 300, "pair_bandwidth_gbps": -1}),
     r"nodes\[0\]: pair_bandwidth_gbps must be a positive number, got -1"),
    (_device(memory_gb=float("inf")), r"nodes\[0\]: memory_gb must be a positive number"),
    (_device(memory_gb="80"), r"nodes\[0\]: memory_gb must be a positive number, got '80'"),
    # a GPU whose memory rounds to 0 bytes
    (_device(memory_gb=1e-12), r"nodes\[0\]: memory_gb=1e-12 is less than one byte"),
    (_device(memory_gb=2**-31), r"nodes\[0\]: memory_gb=4.6\d+e-10 is less than one byte"),
    # absurd sizes: refused before a billion nodes are built
    (_nodes(count=10**9), r"nodes\[0\]: count: the cluster would have 4,000,000,000 "
                          r"devices, more than the 131,072"),
    (_nodes(devices=10**6), r"nodes\[0\]: count: the cluster would have 1,000,000 devices"),
    ({"nodes": [{"devices": 8, "count": 10000}, {"devices": 8, "count": 10000}]},
     r"nodes\[1\]: count: the cluster would have 160,000 devices"),
    # unknown dtype in peak_tflops, bad peaks
    (_device(peak_tflops={"fp8": 1979}),
     r"nodes\[0\]: unknown dtype 'fp8' in peak_tflops; known: float64, float32, tf32, "
     r"bfloat16, float16, int8"),
    (_device(peak_tflops={"bfloat16": -312}),
     r"nodes\[0\]: peak_tflops\['bfloat16'\] must be a positive number, got -312"),
    (_device(peak_tflops={}), r"nodes\[0\]: peak_tflops must be a dict"),
    (_device(peak_tflops=312), r"nodes\[0\]: peak_tflops must be a dict"),
    # unknown device / link names
    (_nodes(device="V100"),
     r"nodes\[0\]: unknown device 'V100'; known: A100-80GB, H100-80GB"),
    (_nodes(device=["A100-80GB"]), r"nodes\[0\]: device must be a name or a dict"),
    (_nodes(fabric="nvlink5"),
     r"nodes\[0\]: unknown link 'nvlink5'; known: nvlink3, nvlink4, nvlink3-mesh4, hdr-ib, ndr-ib"),
    ({"nodes": [{"devices": 4}], "network": {"nic": "ethernet"}},
     "network: unknown link 'ethernet'; known: nvlink3, nvlink4, nvlink3-mesh4, hdr-ib, ndr-ib"),
    ({"nodes": [{"devices": 4}], "network": "hdr-ib"}, "network must be a dict"),
    # unknown top-level field
    ({"nodes": [{"devices": 4}], "gpus": 4, "switch": "x"},
     "unknown cluster field\\(s\\): gpus, switch"),
    # a node without NICs cannot join a multi-node cluster
    ({"nodes": [{"devices": 4, "count": 2, "nics": 0}]},
     "a node with nics: 0 cannot talk to the other nodes"),
    ({"nodes": [{"devices": 4}, {"devices": 4, "nics": 0}]},
     "a node with nics: 0 cannot talk to the other nodes"),
    # bad oversubscription
    ({"nodes": [{"devices": 4}], "network": {"oversubscription": 0}},
     "network: oversubscription must be a positive number, got 0"),
    ({"nodes": [{"devices": 4}], "network": {"oversubscription": -2}},
     "network: oversubscription must be a positive number, got -2"),
    ({"nodes": [{"devices": 4}], "network": {"oversubscription": "2:1"}},
     "network: oversubscription must be a positive number, got '2:1'"),
])
def test_validation_errors_name_the_field(description, match):
    with pytest.raises(ValueError, match=match):
        sc.Cluster.from_dict(description)


def test_validation_error_from_yaml_names_the_field(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("nodes:\n  - devices: 4\n    fabric: {bandwidth_gbps: -1}\n")
    with pytest.raises(ValueError, match=r"nodes\[0\]: bandwidth_gbps must be a positive"):
        sc.Cluster.from_yaml(path)


@pytest.mark.parametrize("text, line, key", [
    ("nodes:\n  - devices: 4\n    devices: 8\n", 3, "devices"),
    ("name: a\nnodes:\n  - devices: 4\nname: b\n", 4, "name"),
    ("nodes:\n  - devices: 4\n    fabric: {bandwidth_gbps: 1, bandwidth_gbps: 2}\n", 3,
     "bandwidth_gbps"),
])
def test_duplicate_yaml_keys_are_an_error(tmp_path, text, line, key):
    """Plain YAML keeps the last value silently: which one the author meant is unknown."""
    path = tmp_path / "dup.yaml"
    path.write_text(text)
    with pytest.raises(ValueError, match=f"dup.yaml, line {line}: the key '{key}' is given "
                                         "twice"):
        sc.Cluster.from_yaml(path)


def test_absurd_preset_node_counts_are_an_error():
    with pytest.raises(ValueError, match="nodes=1000000: the cluster would have 8,000,000"):
        sc.Cluster.preset("dgx-h100", nodes=10**6)
    assert sc.Cluster.preset("dgx-a100", nodes=256).world_size == 2048


def test_unknown_field_in_a_node_group_is_an_error():
    with pytest.raises(ValueError, match=r"nodes\[0\].*unknown.*fabrik"):
        sc.Cluster.from_dict(_nodes(fabrik="nvlink4"))


def test_unknown_field_in_the_network_is_an_error():
    with pytest.raises(ValueError, match=r"network.*unknown.*oversub"):
        sc.Cluster.from_dict({"nodes": [{"devices": 4}], "network": {"oversub": 3}})


def test_oversubscription_below_one_is_an_error():
    with pytest.raises(ValueError, match="oversubscription"):
        sc.Cluster.from_dict({"nodes": [{"devices": 4, "count": 2}],
                              "network": {"oversubscription": 0.5}})


def test_boolean_count_is_an_error():
    with pytest.raises(ValueError, match="count must be a positive integer"):
        sc.Cluster.from_dict(_nodes(count=True))


def test_a_single_node_keeps_zero_nics():
    s = sc.Cluster.from_dict(_nodes(nics=0)).spec
    assert s.nodes[0].nics == 0


def test_custom_device_without_float32_peak_is_rejected_or_runs():
    description = _device(peak_tflops={"bfloat16": 100})
    try:
        c = sc.Cluster.from_dict(description)
    except ValueError as e:
        assert "float32" in str(e)
        return
    run = c.run(lambda: (torch.ones(8, 8) @ torch.ones(8, 8)).sum().item(), world_size=1)
    assert run.results == [64.0]


# ======================================================= peak FLOP/s lookup
def test_flops_for_each_dtype():
    a100 = spec.A100_80GB
    assert a100.flops_for(torch.bfloat16) == 312 * TFLOPS
    assert a100.flops_for(torch.float16) == 312 * TFLOPS
    assert a100.flops_for(torch.float32) == 19.5 * TFLOPS
    assert a100.flops_for(torch.float64) == 19.5 * TFLOPS
    assert a100.flops_for(torch.int8) == 624 * TFLOPS


def test_flops_for_fallbacks_follow_the_docstring():
    a100 = spec.A100_80GB
    assert a100.flops_for(None) == 19.5 * TFLOPS
    assert a100.flops_for(torch.int32) == 624 * TFLOPS
