"""Each alert rule fires on the failure it names and stays quiet on a healthy run."""

from __future__ import annotations

from grpocli.inspection.alerts import RULES, Watch, check, scan


def healthy(steps: int = 30) -> list[dict]:
    return [{"step": s, "reward": 0.1 + 0.02 * s, "frac_reward_zero_std": 0.2, "completions/clipped_ratio": 0.1,
             "completions/mean_length": 40.0 + s, "kl": 0.01 + 0.001 * s,
             "rewards/format.soft/mean": 0.2 + 0.02 * s, "rewards/math.accuracy/mean": 0.1 + 0.01 * s,
             "entropy": 0.6 - 0.01 * s, "grad_norm": 0.5 + 0.3 * (s % 3), "skipped_update": 0.0}
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
    # a [[data.sources]] mixture's per-source means (rewards/<source>/<reward>/mean) are no rewards of their own
    mixed = [{**m, "rewards/gsm8k/format.soft/mean": m["rewards/format.soft/mean"],
              "rewards/gsm8k/math.accuracy/mean": 0.1} for m in flat_task]
    assert codes(check(mixed)) == {"format_only"}
    assert "gsm8k" not in check(mixed)[0].message


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
    spread, w = scan(h)  # sorted by first step: spread_loss warned before no_signal held
    assert (w.code, w.step, w.last_step) == ("no_signal", 20, 30)
    assert (spread.code, spread.step, spread.last_step) == ("spread_loss", 13, 32)


def test_watch_shows_each_alert_once_while_it_holds():
    watch = Watch()
    shown = []
    for m in with_values(healthy(40), 11, frac_reward_zero_std=1.0):
        shown += [(w.code, w.step) for w in watch.update(m)]
    assert shown == [("spread_loss", 13), ("no_signal", 20)]  # spread_loss stops when no_signal holds
    assert set(RULES) == {"no_signal", "truncated", "format_only", "length_explosion", "kl_explosion",
                          "entropy_collapse", "spread_loss", "skipped_updates", "grad_spike"}


def test_entropy_collapse_needs_a_fall_and_a_low_level():
    h = with_values(healthy(), 21, entropy=0.05)  # 0.58 at the start -> 0.05: 9%, below 0.1
    (w,) = check(h)
    assert w.code == "entropy_collapse" and "temperature" in w.message and "entropy_coef" in w.message
    assert check(with_values(healthy(), 21, entropy=0.15)) == []       # 26% of the start: not yet
    high = with_values(healthy(), 1, entropy=lambda s: 5.0 if s <= 5 else 0.5)  # 10%, but 0.5 nats
    assert check(high) == []
    # skipped updates log entropy 0: not a collapse
    skips = with_values(healthy(), 24, entropy=lambda s: 0.0 if s % 2 else 0.4, skipped_update=lambda s: float(s % 2))
    assert "entropy_collapse" not in codes(check(skips))


def test_spread_loss_rising_share_of_flat_groups():
    h = with_values(healthy(), 24, frac_reward_zero_std=0.7)
    (w,) = check(h)
    assert w.code == "spread_loss" and "20% -> 70%" in w.message and "fill_batch" in w.message
    assert check(with_values(healthy(), 24, frac_reward_zero_std=0.45)) == []   # not high
    flat_from_start = with_values(healthy(), 1, frac_reward_zero_std=0.7)      # high, but not rising
    assert check(flat_from_start) == []
    # once no_signal holds, it speaks alone
    assert codes(check(with_values(healthy(), 11, frac_reward_zero_std=1.0))) == {"no_signal"}


def test_skipped_updates_share_over_a_window():
    h = with_values(healthy(), 27, skipped_update=1.0)  # 4 of the last 10
    (w,) = check(h)
    assert w.code == "skipped_updates" and "4 of the last 10" in w.message
    assert check(with_values(healthy(), 29, skipped_update=1.0)) == []   # 2 of 10
    assert "skipped_updates" in codes(check(with_values(healthy(5), 1, skipped_update=1.0)))  # early too


def test_grad_spike_against_the_running_median():
    h = with_values(healthy(), 30, grad_norm=25.0)  # median 0.8
    (w,) = check(h)
    assert w.code == "grad_spike" and w.step == 30 and "31x" in w.message and "max_grad_norm" in w.message
    assert check(with_values(healthy(), 30, grad_norm=6.0)) == []  # 7.5x
    (s,) = scan(with_values(with_values(healthy(), 20, grad_norm=25.0), 21, grad_norm=0.5))
    assert (s.code, s.step, s.last_step) == ("grad_spike", 20, 20)
