import pytest

from tpurt_ray import slice_shape


def test_v4_2x2x2_is_two_hosts_of_four_chips_along_z():
    s = slice_shape("2x2x2", "v4")
    assert (s.pod_type, s.chips, s.chips_per_host, s.num_hosts) == ("v4-16", 8, 4, 2)
    assert s.chips_per_host_bounds == (2, 2, 1) and s.host_bounds == (1, 1, 2)
    env = s.host_env(1, "a")
    assert env["TPU_WORKER_ID"] == "1" and env["TPU_ACCELERATOR_TYPE"] == "v4-16"
    assert env["TPU_HOST_BOUNDS"] == "1,1,2" and env["TPU_TOPOLOGY"] == "2x2x2"


def test_v6e_follows_rays_chips_per_host_and_its_override():
    assert slice_shape("2x4", "v6e").num_hosts == 1  # one 8-chip VM
    s = slice_shape("2x4", "v6e", chips_per_host=4)  # or two 4-chip VMs
    assert (s.num_hosts, s.host_bounds, s.pod_type) == (2, (1, 2, 1), "v6e-8")
    assert slice_shape("4x4", "v5litepod").num_hosts == 4


def test_bad_shapes_are_named():
    with pytest.raises(ValueError, match="AxB"):
        slice_shape("2xx2", "v4")
    with pytest.raises(ValueError, match="1, 2, 4 or 8 chips"):
        slice_shape("2x2x2", "v4", chips_per_host=3)
    with pytest.raises(ValueError, match="does not split"):
        slice_shape("2x1", "v6e", chips_per_host=2)
    with pytest.raises(ValueError, match="worker_id 2"):
        slice_shape("2x2x2", "v4").host_env(2, "a")


def test_chip_coordinates_count_hosts_and_chips_x_fastest():
    s = slice_shape("2x2x2", "v4")
    assert [s.chip_coords(1, c) for c in range(4)] == [[0, 0, 1], [1, 0, 1], [0, 1, 1], [1, 1, 1]]
    s = slice_shape("2x4", "v6e", chips_per_host=4)
    assert [s.chip_coords(1, c) for c in range(4)] == [[0, 2], [1, 2], [0, 3], [1, 3]]
