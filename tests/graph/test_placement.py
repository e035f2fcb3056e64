"""Where a node's channels run (`conveyor.graph.placement`): Quokka's placement arguments as a channel count.

A count, or channels per machine (which add up: Spark places partitions on any executor); anything
else is an error naming the node and what it got.
"""

from __future__ import annotations

import pytest

from conveyor.graph import GraphError
from conveyor.graph.placement import channel_count


def test_a_count_or_channels_per_machine_give_the_channels() -> None:
    assert channel_count(8, "localhost", "node 1") == 8
    assert channel_count({"localhost": 8}, "localhost", "node 1") == 8
    assert channel_count({"10.0.0.1": 4, "10.0.0.2": 3}, "localhost", "node 1") == 7


@pytest.mark.parametrize(
    ("parallelism", "ip", "said"),
    [
        (0, "localhost", "parallelism must be an integer >= 1 or a mapping of machine -> channels"),
        (True, "localhost", "got True"),
        (2.0, "localhost", "got 2.0"),
        ({}, "localhost", "parallelism maps no machine to channels"),
        ({"10.0.0.1": 0}, "localhost", "machine '10.0.0.1' must get an integer >= 1 of channels, got 0"),
        ({"": 2}, "localhost", "must map machine addresses (strings) to channels, got key ''"),
        (2, "", "ip must be a machine's address or 'localhost', got ''"),
        (2, None, "got None"),
    ],
)
def test_a_bad_placement_is_an_error_naming_the_node_and_what_it_got(parallelism: object, ip: object, said: str) -> None:
    with pytest.raises(GraphError) as e:
        channel_count(parallelism, ip, "node 3 (lineitem)")
    assert str(e.value).startswith("node 3 (lineitem): ") and said in str(e.value)
