"""What researchers look at: evaluation videos (each frame over the critic's V(s) and the
return-to-go of its episode, the numbers kept beside) and the study's bar chart."""

import json
import shutil

import numpy as np
import pytest

from fused.errors import ConfigError

VALUE_COLOUR, RETURN_COLOUR, MARK_COLOUR = (31, 119, 180), (230, 110, 0), (160, 160, 160)


def discounted(reward, gamma):
    """G_t = sum_k gamma^k r_{t+k}, by hand (an episode that terminates at its last step)."""
    out, g = np.zeros(len(reward)), 0.0
    for t in range(len(reward) - 1, -1, -1):
        g = reward[t] + gamma * g
        out[t] = g
    return out


def episode(steps, frames, critic=True, seed=0):
    from fused.video import Episode

    rng = np.random.default_rng(seed)
    ep = Episode()
    for t in range(steps):
        if t < frames:
            ep.frames.append(np.full((32, 48, 3), (20 * t) % 200, np.uint8))
        ep.steps["reward"].append(float(rng.choice([0.0, 0.0, 1.0, -0.5])))
        ep.steps["value"].append(float(np.sin(t / 5)) if critic else float("nan"))
        ep.steps["terminated"].append(t == steps - 1)
        ep.steps["truncated"].append(False)
        ep.steps["truncation_value"].append(0.0)
    return ep


def pixel(frame, row, col):
    return tuple(int(c) for c in frame[row, col, :3])


def check_drawn(video, z):
    """Every frame t marks step t at the column and rows its numbers scale to in the box the
    .npz states (computed here, not by the drawing code): a 5 x 5 square of V's colour at
    V(s_t) and of G's at G_t (where it is not under V's), a grey line elsewhere in the column;
    the curves pass through every step."""
    x0, y0, x1, y1 = z["plot_box"]
    lo, hi = z["plot_range"]
    steps = len(z["reward"])
    col = lambda t: int(round(x0 + t * (x1 - x0) / (steps - 1)))  # noqa: E731
    row = lambda v: int(round(y1 - (v - lo) / (hi - lo) * (y1 - y0)))  # noqa: E731
    critic = bool(z["critic"])

    def square(frame, r, c):
        return {pixel(frame, r + dr, c + dc) for dr in (-2, 0, 2) for dc in (-2, 0, 2)}

    for t in range(len(video)):
        g, v = z["return_to_go"][t], z["value"][t]
        if critic:
            assert square(video[t], row(v), col(t)) == {VALUE_COLOUR}, t
        if not critic or abs(row(v) - row(g)) > 4:
            assert square(video[t], row(g), col(t)) == {RETURN_COLOUR}, t
        assert (video[t][y0:y1 + 1, col(t)] == MARK_COLOUR).all(-1).sum() > (y1 - y0) // 2
    last = video[-1]
    for t in range(steps):
        for s, colour in [(z["return_to_go"], RETURN_COLOUR)] + (
                [(z["value"], VALUE_COLOUR)] if critic else []):
            near = [pixel(last, r, col(t)) for r in range(row(s[t]) - 1, row(s[t]) + 2)]
            if colour == RETURN_COLOUR and VALUE_COLOUR in near:
                continue  # (V's curve drawn over G's there)
            assert colour in near, (t, colour, near)


@pytest.mark.filterwarnings("ignore:os.fork")  # (reading the MP4 back starts ffmpeg)
def test_videos_draw_the_numbers_they_keep(tmp_path):
    """Frames over the curves of their episode (40 steps, 30 frames): the .npz beside each
    video holds G_t as `label.py returns` computes it (and by hand), the frames draw those
    numbers where the stated box puts them; GIF and MP4 hold the same frames; a policy without
    a critic shows G_t alone (no V pixel), its legend says so."""
    import imageio.v3 as iio

    from fused.data.returns import returns_to_go
    from fused.video import write_videos

    eps = [episode(40, 30), episode(25, 25, seed=1)]
    paths = write_videos(eps, tmp_path / "v", 0.9, "the test's", critic=True)
    assert [p.name for p in paths] == ["episode_000.gif", "episode_001.gif"]
    for ep, gif in zip(eps, paths):
        z = np.load(gif.with_suffix(".npz"))
        assert float(z["gamma"]) == 0.9 and str(z["gamma_source"]) == "the test's"
        reward = np.asarray(ep.steps["reward"], np.float32)
        n = len(reward)
        np.testing.assert_array_equal(z["reward"], reward)
        np.testing.assert_array_equal(z["value"], np.float32(ep.steps["value"]))
        label, _, _ = returns_to_go(reward, z["terminated"], z["truncated"],
                                    np.zeros(n, np.int64), z["value"], z["truncation_value"],
                                    0.9)
        np.testing.assert_allclose(z["return_to_go"], label, rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(z["return_to_go"], discounted(reward, 0.9), atol=1e-5)
        video = iio.imread(gif)[..., :3]
        assert len(video) == int(z["frames"]) == len(ep.frames)
        assert video.shape[1] % 2 == 0 and video.shape[2] % 2 == 0
        np.testing.assert_array_equal(video[:, :32, :48], np.stack(ep.frames))
        check_drawn(video, z)
        mp4 = iio.imread(gif.with_suffix(".mp4"), plugin="FFMPEG")
        assert mp4.shape == video.shape  # (lossy: the same frames, not the same pixels)
        assert np.abs(mp4.astype(int) - video).mean() < 8
    blind = write_videos([episode(20, 20, critic=False)], tmp_path / "b", 0.99, "default",
                         critic=True)[0]  # (NaN values: no critic, whatever the caller says)
    z, video = np.load(blind.with_suffix(".npz")), iio.imread(blind)[..., :3]
    assert not z["critic"] and np.isnan(z["value"]).all()
    assert not (video == VALUE_COLOUR).all(-1).any()
    check_drawn(video, z)
    # a critic the run did not train is not drawn, its finite values kept in the .npz
    untrained = write_videos([episode(20, 20)], tmp_path / "u", 0.99, "default",
                             critic=False)[0]
    z, video = np.load(untrained.with_suffix(".npz")), iio.imread(untrained)[..., :3]
    assert not z["critic"] and np.isfinite(z["value"]).all()
    assert not (video == VALUE_COLOUR).all(-1).any()


@pytest.mark.slow
def test_video_gamma_is_the_runs_own(tmp_path, smoke_run):
    """--video-gamma, else a train.py run's ppo.gamma, an offline run's returns set's gamma,
    else 0.99; an offline run trained with --value-coef 0 has no critic to draw; a gamma
    outside [0, 1] is one line naming the flag."""
    from fused.commands.offline_eval import has_critic, video_gamma
    from fused.data.store import Dataset
    from fused.video import check_video_gamma

    online = tmp_path / "online"
    shutil.copytree(smoke_run, online, ignore=shutil.ignore_patterns("checkpoints"))
    saved = json.loads((online / "config.json").read_text())
    assert video_gamma(online, None) == (saved["ppo"]["gamma"], "the run's ppo.gamma")
    saved["ppo"]["gamma"] = 0.9
    (online / "config.json").write_text(json.dumps(saved))
    assert video_gamma(online, None) == (0.9, "the run's ppo.gamma") and has_critic(online)
    assert video_gamma(online, 0.5) == (0.5, "--video-gamma")
    data = tmp_path / "data"
    Dataset(data).write_card({"env": "Craftax-Classic-Symbolic-v1", "returns": {
        "r95": {"gamma": 0.95}}})
    offline = tmp_path / "bc"
    offline.mkdir()
    (offline / "config.json").write_text(json.dumps({"algo": "bc", "data": str(data),
                                                     "returns": None, "value_coef": 0.0}))
    assert video_gamma(offline, None) == (0.95, "returns set 'r95'")
    assert not has_critic(offline)
    shutil.rmtree(data)
    assert video_gamma(offline, None) == (0.99, "default")
    for bad in (1.5, -0.1):
        with pytest.raises(ConfigError, match="--video-gamma"):
            check_video_gamma(bad)


@pytest.mark.slow
def test_eval_video_numbers_are_the_critics_and_label_returns(tmp_path, smoke_run):
    """The watched episodes of the smoke run, played to their ends with the dataset record
    beside: each step kept is the record's; V(s) kept equals the checkpoint's critic applied
    to the recorded observations; G_t equals `label.py returns` (fused.data.returns.
    compute_returns) on that episode written as a dataset; the frames draw them."""
    import jax
    import imageio.v3 as iio

    from fused.agent import needs_text
    from fused.commands.offline_eval import video_gamma
    from fused.data.config import ReturnsConfig
    from fused.data.played import episodes_of, write_played
    from fused.data.returns import compute_returns
    from fused.data.store import Dataset
    from fused.envspec import spec
    from fused.rl.acting import network_policy
    from fused.rl.envs import make_env
    from fused.rl.evaluate import make_evaluate
    from fused.rl.obs_codec import ObsCodec
    from fused.trained_policy import load_policy
    from fused.video import FrameWatch, write_videos
    from rich.console import Console

    pol = load_policy(smoke_run, 2)
    name = pol.cfg.env.name
    env = make_env(pol.cfg.env, needs_text(pol.cfg))
    watch = FrameWatch(name, 2, 6)
    ev = make_evaluate(env, network_policy(pol.agent.network), pol.agent.inputs, 2, 64,
                       record=spec(name), watch=watch)
    state = jax.jit(ev.init)(jax.random.PRNGKey(0), None, pol.inputs_state)
    # (committed to the device, as the blocks' states come back: init's state, made from no
    # committed input, was not, which made the first block a program of its own, ~5 s to compile)
    state = jax.device_put(state, jax.devices()[0])
    block = jax.jit(ev.block)
    records, live = [], []
    while not bool(np.asarray(state.done).all()):
        state, extras = block(state, pol.params, None)
        rec, alive = jax.device_get(extras["record"])
        records.append(rec)
        live.append(alive)
        watch.add(extras["watch"])
    gamma, _ = video_gamma(smoke_run, None)
    gifs = write_videos(watch.episodes, tmp_path / "videos", gamma, "the run's", critic=True)
    played = episodes_of(records, live)
    data = tmp_path / "data"
    write_played(data, name, played, {"policy": str(smoke_run)}, 256)
    compute_returns(ReturnsConfig(data=str(data), gamma=gamma), Console(quiet=True))
    ds = Dataset(data)
    rtg = np.concatenate([ds.read_returns(f"gamma{gamma:g}", n)["rtg"] for n in ds.shard_names()])
    episode_id = np.concatenate([ds.read(n, ["episode_id"])["episode_id"]
                                 for n in ds.shard_names()])
    codec = ObsCodec(spec(name))
    network = pol.agent.network
    for e, (gif, rows) in enumerate(zip(gifs, played)):
        z = np.load(gif.with_suffix(".npz"))
        assert len(z["reward"]) == len(rows["action"]) == int(np.asarray(state.length)[e])
        for k in ("reward", "terminated", "truncated", "truncation_value", "value"):
            np.testing.assert_array_equal(z[k], rows[k], err_msg=k)
        assert z["terminated"][-1] or z["truncated"][-1]  # (played to its end)
        obs = codec.decode(np, {k: rows[k] for k in codec.columns})  # (the plain input)
        critic = np.asarray(network.apply(pol.params, obs, method=type(network).critic))
        np.testing.assert_allclose(z["value"], critic, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(z["return_to_go"], rtg[episode_id == e], rtol=1e-5,
                                   atol=1e-5)
        video = iio.imread(gif)[..., :3]
        assert len(video) == 6 and bool(z["critic"])
        check_drawn(video, z)


def test_study_chart_bars_are_the_tables_numbers(tmp_path):
    """study.png's bars: one per row of study.md, its height the row's mean return and its
    error bar the row's 95% interval (read back from the table's text); grouped by algorithm,
    one colour per label set, the behaviour policy first."""
    import imageio.v3 as iio

    from fused.commands.offline_study import study_figure, table
    from fused.runs.metrics import save_figure

    def variant(algo, labels, m, lo, hi):
        return {"return_mean": m, "return_ci95": [lo, hi], "seed_means": [m - 0.1, m + 0.1],
                "episodes": 64, "vs_behaviour": m / 2.0, "algo": algo, "labels": labels}

    results = {"variants": {"awr-plain": variant("awr", "plain", 3.2, 2.5, 3.9),
                            "awr-l24": variant("awr", "l24", 4.1, 3.0, 5.2),
                            "bc-plain": variant("bc", "plain", -0.5, -1.2, 0.25),
                            "bc-l24": variant("bc", "l24", 1.0, 0.4, 1.6)},
               "behaviour": {"return_mean": 2.0, "return_ci95": [1.5, 2.5],
                             "seed_means": [2.0], "episodes": 64}}
    fig, bars = study_figure(results)
    path = save_figure(fig, tmp_path / "study.png", dpi=100)
    assert iio.imread(path).ndim == 3
    rows = [r.strip("|").split("|") for r in table(results).splitlines()[2:]]
    assert [r[0].strip() for r in rows] == list(bars) == [
        "behaviour policy", "awr-plain", "awr-l24", "bc-plain", "bc-l24"]
    for name, mean, ci, *_ in rows:
        bar = bars[name.strip()]
        lo, hi = (float(x) for x in ci.strip(" []").split(","))
        assert bar[0].get_height() == pytest.approx(float(mean), abs=0.005), name
        (_, bottom), (_, top) = bar.errorbar.lines[2][0].get_segments()[0]
        assert (bottom, top) == (pytest.approx(lo, abs=0.005), pytest.approx(hi, abs=0.005))
    x = {n: b[0].get_x() for n, b in bars.items()}
    colour = {n: b[0].get_facecolor() for n, b in bars.items()}
    assert x["behaviour policy"] < x["awr-plain"] < x["awr-l24"] < x["bc-plain"] < x["bc-l24"]
    assert colour["awr-plain"] == colour["bc-plain"] != colour["awr-l24"] == colour["bc-l24"]
