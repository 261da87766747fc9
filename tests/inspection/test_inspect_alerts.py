"""Each alert rule fires on the failure it names and stays quiet on a healthy run."""

from __future__ import annotations

from grpocli.inspection.alerts import RULES, Watch, check, scan


def healthy(steps: int = 30) -> list[dict]:
    return [{"step": s, "reward": 0.1 + 0.02 * s, "frac_reward_zero_std": 0.2, "completions/clipped_ratio": 0.1,
             "completions/mean_length": 40.0 + s, "kl": 0.01 + 0.001 * s,
             "rewards/format.soft/mean": 0.2 + 0.02 * s, "rewards/math.accuracy/mean": 0.1 + 0.01 * s}
            for s in range(1, steps + 1)]


def with_values(history: list[dict], start: int, **values) -> list[dict]:
    """Set metric values (keys with '__' for '/') from step ``start`` on; callables get the step."""
    out = []
    for m in history:
        m = dict(m)
        if m["step"] >= start:
            for key, v in values.items():
                m[key.replace("__", "/")] = v(m["step"]) if callable(v) else v
        out.append(m)
    return out


def codes(alerts) -> set[str]:
    return {w.code for w in alerts}


def test_healthy_run_has_no_alerts():
    assert check(healthy()) == [] and scan(healthy()) == []


def test_no_signal_needs_ten_steps_near_one():
    h = with_values(healthy(), 21, frac_reward_zero_std=0.95)
    assert "no_signal" in codes(check(h))
    (w,) = [w for w in check(h) if w.code == "no_signal"]
    assert w.step == 30 and "95%" in w.message
    assert "no_signal" not in codes(check(with_values(healthy(), 22, frac_reward_zero_std=0.95)))  # 9 steps
    assert "no_signal" not in codes(check(with_values(healthy(), 21, frac_reward_zero_std=0.85)))


def test_truncated():
    h = with_values(healthy(), 26, completions__clipped_ratio=0.7)
    assert codes(check(h)) == {"truncated"}
    # the mean of the last 5 steps decides: 3 x 0.7 + 2 x 0.1 -> 0.46
    assert check(with_values(healthy(), 28, completions__clipped_ratio=0.7)) == []


def test_format_only_rise():
    flat_task = with_values(healthy(), 1, **{"rewards__math.accuracy__mean": 0.1, "rewards__format.soft__mean": lambda s: s / 30})
    assert codes(check(flat_task)) == {"format_only"}
    msg = check(flat_task)[0].message
    assert "format.soft" in msg and "math.accuracy" in msg
    # both rising (the healthy run) and a format reward alone (nothing else to learn) are fine
    assert check(healthy()) == []
    alone = [{k: v for k, v in m.items() if "math.accuracy" not in k} for m in flat_task]
    assert "format_only" not in codes(check(alone))


def test_length_explosion():
    h = with_values(healthy(), 20, completions__mean_length=lambda s: 40.0 * (s - 17))
    assert codes(check(h)) == {"length_explosion"}
    slow = with_values(healthy(), 20, completions__mean_length=70.0)  # < 3x
    assert check(slow) == []


def test_kl_explosion_absolute_and_relative():
    assert codes(check(with_values(healthy(), 28, kl=2.0))) == {"kl_explosion"}
    assert codes(check(with_values(healthy(), 28, kl=0.5))) == {"kl_explosion"}  # 10x its start
    assert check(with_values(healthy(), 28, kl=0.05)) == []


def test_scan_reports_first_and_last_step():
    h = with_values(healthy(40), 11, frac_reward_zero_std=1.0)
    h = with_values(h, 31, frac_reward_zero_std=0.3)
    (w,) = scan(h)
    assert (w.code, w.step, w.last_step) == ("no_signal", 20, 30)


def test_watch_shows_each_alert_once_while_it_holds():
    watch = Watch()
    shown = []
    for m in with_values(healthy(40), 11, frac_reward_zero_std=1.0):
        shown += [(w.code, w.step) for w in watch.update(m)]
    assert shown == [("no_signal", 20)]
    assert set(RULES) == {"no_signal", "truncated", "format_only", "length_explosion", "kl_explosion"}
