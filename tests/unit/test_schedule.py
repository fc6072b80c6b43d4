"""The order the cluster tier's tests are handed out in (helpers.deal_out, tests/conftest.py)."""

from dataclasses import dataclass

from helpers import deal_out, handout_order


@dataclass
class Item:
    """What handout_order reads of a pytest item: its name, fixtures and whether it is marked docker."""
    name: str
    fixturenames: tuple = ()
    docker: bool = False

    def get_closest_marker(self, name):
        return "docker" if name == "docker" and self.docker else None


def test_tests_that_run_one_at_a_time_are_spread_evenly_among_the_others_in_their_order():
    items = [f"t{n}" for n in range(9)] + ["s0", "s1", "s2"]
    dealt = deal_out(items, lambda item: item.startswith("s"))
    assert dealt == ["t0", "s0", "t1", "t2", "t3", "s1", "t4", "t5", "t6", "s2", "t7", "t8"]   # 3 apart


def test_without_tests_of_one_kind_the_order_is_kept():
    items = ["a", "b", "c"]
    assert deal_out(items, lambda item: False) == items
    assert deal_out(items, lambda item: True) == items


def cluster_tier() -> list:
    return ([Item(f"t{n}") for n in range(6)]
            + [Item(f"podman-sdk{n}", ("docker_api",)) for n in range(2)]
            + [Item("docker-train", docker=True)]
            + [Item(f"docker-sdk{n}", ("sdk_local_docker",), docker=True) for n in range(2)])


def test_while_dockers_build_runs_its_tests_go_last_and_each_lock_is_dealt_out():
    order = [item.name for item in handout_order(cluster_tier(), docker_build_running=True)]
    assert order == ["t0", "t1", "podman-sdk0", "t2", "t3", "t4", "t5", "podman-sdk1",
                     "docker-sdk0", "docker-sdk1", "docker-train"]


def test_once_dockers_build_has_ended_its_sdk_jobs_are_dealt_out_among_every_other_test():
    order = [item.name for item in handout_order(cluster_tier(), docker_build_running=False)]
    assert order == ["t0", "t1", "docker-sdk0", "podman-sdk0", "t2", "t3", "t4", "docker-sdk1", "t5",
                     "podman-sdk1", "docker-train"]
