"""``RangeCaculator``: time ranges of the communication / computation overlap analysis, as
torch_npu's. ``generate_time_range(start, end, class_range)``; ``merge_continuous_intervals``
(overlapping or touching ranges joined, sorted by start); ``compute_pipeline_overlap(comm,
compute)``: the communication time not covered by computation (pure communication) and the
gaps where neither runs (free time), both as sorted lists of ranges."""
from dataclasses import dataclass

DEFAULT_INT_VALUE = -1

__all__ = []


@dataclass
class TimeRange:
    start_ts: int = DEFAULT_INT_VALUE
    end_ts: int = DEFAULT_INT_VALUE


class CommunicationTimeRange(TimeRange):
    def __init__(self):
        super().__init__()


def _union(ranges) -> list:
    """Sorted disjoint (start, end) pairs covering ``ranges``."""
    merged = []
    for start, end in sorted((r.start_ts, r.end_ts) for r in ranges):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return merged


class RangeCaculator:
    @staticmethod
    def generate_time_range(start, end, class_range=TimeRange):
        time_range = class_range()
        time_range.start_ts, time_range.end_ts = start, end
        return time_range

    @staticmethod
    def merge_continuous_intervals(time_range_list: list) -> list:
        """Joins overlapping ranges in place (the list is sorted; the first range of each run is kept)."""
        if not time_range_list:
            return []
        time_range_list.sort(key=lambda r: r.start_ts)
        result = [time_range_list[0]]
        for time_range in time_range_list[1:]:
            current = result[-1]
            if time_range.start_ts <= current.end_ts:
                current.end_ts = max(current.end_ts, time_range.end_ts)
            else:
                result.append(time_range)
        return result

    @staticmethod
    def compute_pipeline_overlap(communication_range, compute_range):
        make = RangeCaculator.generate_time_range
        compute = _union(compute_range)
        pure = []
        for start, end in _union(communication_range):
            cursor = start
            for c_start, c_end in compute:
                if c_end <= cursor or c_start >= end:
                    continue
                if c_start > cursor:
                    pure.append(make(cursor, c_start))
                cursor = max(cursor, c_end)
                if cursor >= end:
                    break
            if cursor < end:
                pure.append(make(cursor, end))
        busy = _union(list(communication_range) + list(compute_range))
        free = [make(prev_end, start) for (_, prev_end), (start, _) in zip(busy, busy[1:])]
        return pure, free
