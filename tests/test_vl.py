"""Qwen3-VL in JAX against HF transformers: the image processor (Pillow's bicubic, bit for bit)
on game frames and odd sizes, the vision tower with its DeepStack mergers, M-RoPE positions,
and every text layer with images in the prompt, on tiny random checkpoints of several shapes."""

import functools
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from command_runner import run_command
from qwen_fixtures import build_tiny_qwen3_vl, hf_vl_processor


def classic_frames(n: int) -> np.ndarray:
    """n <= 4 Craftax-Classic pixel observations (63 x 63): the first frame of each of four new
    worlds, as the uint8 round(255 x) that datasets store."""
    assert n <= 4
    return _classic_worlds()[:n].copy()


@functools.cache
def _classic_worlds() -> np.ndarray:
    from craftax.craftax_env import make_craftax_env_from_name

    env = make_craftax_env_from_name("Craftax-Classic-Pixels-v1", auto_reset=False)
    # (one program, the reset of one world, run for each key: a random walk compiled the step's
    # renderer too, ~6 s more; the same frames as a vmapped reset, bit for bit, and the program
    # tests/test_pixels.py::test_pixel_specs_are_craftax_frames_flattened compiles, so the
    # persistent compilation cache serves whichever of the two comes second)
    reset = jax.jit(env.reset_env)
    obs = [reset(key, env.default_params)[0]
           for key in jax.random.split(jax.random.PRNGKey(0), 4)]
    return np.round(np.clip(np.asarray(obs), 0, 1) * 255).astype(np.uint8)


@pytest.mark.slow
def test_processor_equals_hf_on_frames_and_odd_sizes():
    """pixel values within float32 rounding and grids equal to HF's processor's: Craftax-Classic
    frames, 130 x 110 (Craftax-Pixels' size), odd sizes up and down; image-token counts as the
    processor expands `<|image_pad|>` (72 for 130 x 110, 64 for 63 x 63)."""
    from llm_jax.vision import ProcessorConfig, VisionConfigError, preprocess

    pc = ProcessorConfig()
    hf = hf_vl_processor()
    rng = np.random.default_rng(0)
    y, x = np.mgrid[:130, :110]
    smooth = np.stack([(y * 2) % 256, (x * 3) % 256, (x + y) % 256], -1).astype(np.uint8)
    batches = [classic_frames(3), rng.integers(0, 256, (2, 130, 110, 3), dtype=np.uint8),
               smooth[None], rng.integers(0, 256, (2, 37, 91, 3), dtype=np.uint8),
               rng.integers(0, 256, (1, 700, 300, 3), dtype=np.uint8)]
    for imgs in batches:
        ref = hf(images=list(imgs), return_tensors="np")
        ours, grid = preprocess(jnp.asarray(imgs), pc)
        assert [list(grid)] * len(imgs) == ref["image_grid_thw"].tolist()
        np.testing.assert_allclose(np.asarray(ours).reshape(ref["pixel_values"].shape),
                                   ref["pixel_values"], atol=1e-6, rtol=0)
        assert pc.num_tokens(*imgs.shape[1:3]) == int(ref["image_grid_thw"][0].prod()) // 4
    # shrinking 3.6x / 4.7x (Pillow's filter widened by the scale): a small max_pixels
    small = ProcessorConfig(min_pixels=1024, max_pixels=16384)
    hf_small = hf_vl_processor()
    hf_small.size = type(hf_small.size)(shortest_edge=1024, longest_edge=16384)
    imgs = rng.integers(0, 256, (1, 700, 300, 3), dtype=np.uint8)
    ref = hf_small(images=list(imgs), return_tensors="np")
    ours, grid = preprocess(jnp.asarray(imgs), small)
    assert grid == (1, 12, 4) and ref["image_grid_thw"].tolist() == [[1, 12, 4]]
    np.testing.assert_allclose(np.asarray(ours)[0], ref["pixel_values"], atol=1e-6, rtol=0)
    assert (pc.num_tokens(130, 110), pc.num_tokens(63, 63)) == (72, 64)
    with pytest.raises(VisionConfigError, match="give uint8"):
        preprocess(jnp.zeros((1, 63, 63, 3), jnp.float32), pc)


def _rows(cfg, per_image: int, layout: list[list]) -> tuple[np.ndarray, np.ndarray]:
    """Right-padded token rows from layouts: ints are text tokens, "img" an image's
    `<|vision_start|><|image_pad|> x n<|vision_end|>`."""
    rows = []
    for spec in layout:
        row = []
        for item in spec:
            row += ([cfg.vision_start_token_id] + [cfg.image_token_id] * per_image
                    + [cfg.vision_end_token_id]) if item == "img" else [item]
        rows.append(row)
    lengths = np.array([len(r) for r in rows])
    tokens = np.zeros((len(rows), lengths.max()), np.int64)
    for r, row in enumerate(rows):
        tokens[r, :len(row)] = row
    return tokens, lengths


SHAPES = {
    # merge 2, DeepStack after two of three tower layers, tied embeddings; two frames of the
    # full game's size, one per row, rows of different lengths
    "merge2": (dict(merge=2, deepstack=(0, 2), depth=3), (130, 110),
               [[5, 6, "img", 10, 11], [7, "img", 12, 13, 14, 15]]),
    # merge 1, one DeepStack layer, untied, patch 8, a 4 x 4 position table stretched to the
    # grid, another mrope split; three odd-sized images, two of them in one row
    "merge1": (dict(merge=1, deepstack=(1,), depth=2, patch=8, positions=16, section=(2, 3, 3),
                    tied=False, heads=2, kv_heads=1), (37, 91),
               [[5, "img", 9, "img", 10], ["img", 11]]),
    # as many DeepStack states as text layers: the last one lands before the final norm
    "deep_all": (dict(merge=2, deepstack=(0, 1), depth=2, layers=2), (63, 63),
                 [[5, "img", 6]]),
    # Qwen3-VL-MoE: 4 experts, top 2, a dense layer between sparse ones (mlp_only_layers),
    # stacked expert tensors as transformers 5 saves them
    "moe": (dict(merge=2, deepstack=(0, 1), depth=2, experts=4, top_k=2, mlp_only=(1,),
                 router_scale=4.0), (63, 63), [[5, "img", 6, 7], [8, 9, "img", 10]]),
}


@pytest.mark.parametrize("shape", [  # the fast lane checks the first shape
    "merge2", *(pytest.param(s, marks=pytest.mark.slow) for s in SHAPES if s != "merge2")])
def test_tower_positions_and_every_layer_equal_hf(tmp_path, shape):
    """Vision tower (merged tokens and each DeepStack state), M-RoPE positions and deltas, and
    the text model's hidden states at every layer (HF's output_hidden_states, DeepStack
    included) within 1e-4 of HF transformers in float32."""
    import torch

    from llm_jax.model import rms_norm
    from llm_jax.mrope import rope_index
    from llm_jax.vision import preprocess, vision_tower
    from llm_jax.vl_loader import load_vl_params
    from llm_jax.vl_model import vl_hidden_states

    kw, size, layout = SHAPES[shape]
    model = build_tiny_qwen3_vl(tmp_path / "vl", **kw)
    cfg, params = load_vl_params(tmp_path / "vl")
    n_images = sum(item == "img" for spec in layout for item in spec)
    imgs = np.random.default_rng(1).integers(0, 256, (n_images, *size, 3), dtype=np.uint8)
    hf = hf_vl_processor(kw.get("patch", 16), kw["merge"])(images=list(imgs),
                                                            return_tensors="pt")
    pixels, grid = preprocess(jnp.asarray(imgs), cfg.processor)
    per_image = int(np.prod(grid)) // kw["merge"] ** 2
    tokens, lengths = _rows(cfg, per_image, layout)
    attn = (np.arange(tokens.shape[1])[None] < lengths[:, None]).astype(np.int64)
    mm = (tokens == cfg.image_token_id).astype(np.int64)
    with torch.no_grad():
        feats = model.model.get_image_features(hf["pixel_values"], hf["image_grid_thw"])
        out = model(input_ids=torch.tensor(tokens), attention_mask=torch.tensor(attn),
                    pixel_values=hf["pixel_values"], image_grid_thw=hf["image_grid_thw"],
                    mm_token_type_ids=torch.tensor(mm), output_hidden_states=True)
        ref_pos, ref_delta = model.model.get_rope_index(
            torch.tensor(tokens), torch.tensor(mm), hf["image_grid_thw"],
            attention_mask=torch.tensor(attn))

    tower = vision_tower(params.vision, cfg.vision, pixels, grid)
    h = cfg.text.hidden_size
    np.testing.assert_allclose(np.asarray(tower.embeds).reshape(-1, h),
                               torch.cat(feats.pooler_output).numpy(), atol=1e-4, rtol=0)
    assert tower.deepstack.shape[0] == len(kw["deepstack"])
    for ours, ref in zip(tower.deepstack, feats.deepstack_features):
        np.testing.assert_allclose(np.asarray(ours).reshape(-1, h), torch.cat(ref).numpy(),
                                   atol=1e-4, rtol=0)
    pos, delta = rope_index(tokens, lengths, cfg, grid, n_images)
    with pytest.raises(ValueError, match=f"for {n_images + 1} images"):
        rope_index(tokens, lengths, cfg, grid, n_images + 1)
    valid = attn.astype(bool)
    np.testing.assert_array_equal(pos[:, valid], ref_pos.numpy()[:, valid])
    np.testing.assert_array_equal(delta, ref_delta.numpy().ravel())
    for layer in range(cfg.text.num_layers + 1):
        x = vl_hidden_states(params, cfg, jnp.asarray(tokens), jnp.asarray(lengths), layer,
                             pixels, grid, jnp.asarray(pos)).x
        if layer == cfg.text.num_layers:  # HF's last entry is after the final norm
            x = rms_norm(x, params.text.final_norm, cfg.text.rms_norm_eps)
        ref = out.hidden_states[layer].numpy()
        assert np.abs(ref[valid]).max() > 0.1
        np.testing.assert_allclose(np.asarray(x)[valid], ref[valid], atol=1e-4, rtol=0,
                                   err_msg=f"layer {layer}")


def test_a_damaged_vl_folder_is_one_line(tmp_path):
    """A missing tower tensor, a text-only config: one error naming what is wrong."""
    from safetensors.numpy import load_file, save_file

    from llm_jax.config import Qwen3ConfigError
    from llm_jax.loader import WeightsError
    from llm_jax.vl_loader import load_vl_params

    folder = tmp_path / "vl"
    build_tiny_qwen3_vl(folder, depth=2, deepstack=(1,))
    tensors = load_file(folder / "model.safetensors")
    del tensors["model.visual.blocks.1.attn.qkv.bias"]
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(WeightsError, match=r"1 missing: \['model.visual.blocks.1.attn.qkv.bias'"):
        load_vl_params(folder)
    conf = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(dict(conf, model_type="qwen3")))
    with pytest.raises(Qwen3ConfigError, match="not 'qwen3_vl'"):
        load_vl_params(folder)


def test_vl_moe_reads_released_and_saved_expert_layouts_as_hf_does(tmp_path):
    """A Qwen3-VL-MoE's stacked experts as released ([E, H, 2F], [E, F, H]) and as transformers
    5 saves them (transposed): HF loads both to one model; so do we (each expert's gate, up
    and down from the right slices: greedy decode with an image equals HF `generate` on the
    released folder), and a tensor of neither shape is one line naming it."""
    import jax
    import torch
    from safetensors.numpy import load_file, save_file
    from transformers import Qwen3VLMoeForConditionalGeneration

    from llm_jax.decode import GenerateSpec
    from llm_jax.loader import WeightsError
    from llm_jax.mrope import rope_index
    from llm_jax.vision import preprocess
    from llm_jax.vl_loader import load_vl_params
    from llm_jax.vl_model import vl_generate

    build_tiny_qwen3_vl(tmp_path / "saved", experts=4, top_k=2, router_scale=4.0, seed=8,
                        deepstack=(0,), depth=2)
    released = tmp_path / "released"
    released.mkdir()
    tensors = load_file(tmp_path / "saved" / "model.safetensors")
    stacked = [n for n in tensors if n.endswith(("experts.gate_up_proj", "experts.down_proj"))]
    assert len(stacked) == 6 and tensors[stacked[0]].shape[1] != tensors[stacked[0]].shape[2]
    for n in stacked:
        tensors[n] = np.ascontiguousarray(tensors[n].transpose(0, 2, 1))
    save_file(tensors, released / "model.safetensors", metadata={"format": "pt"})
    for f in ("config.json", "preprocessor_config.json", "generation_config.json"):
        (released / f).write_bytes((tmp_path / "saved" / f).read_bytes())
    model = Qwen3VLMoeForConditionalGeneration.from_pretrained(released).eval()
    cfg, params = load_vl_params(released)
    _, params_saved = load_vl_params(tmp_path / "saved")
    assert cfg.text.is_moe and cfg.text.norm_topk_prob
    jax.tree.map(np.testing.assert_array_equal, params, params_saved)
    # reading the first layers only (labels, online) equals cutting the whole
    from llm_jax.weights import first_layers

    _, cut = load_vl_params(released, layers=1)
    jax.tree.map(np.testing.assert_array_equal, cut.text,
                 first_layers(params.text, cfg.text, 1))
    imgs = classic_frames(1)
    pixels, grid = preprocess(jnp.asarray(imgs), cfg.processor)
    # a row with the frame and a text row (this random model repeats one token after a frame)
    tokens, lengths = _rows(cfg, cfg.processor.num_tokens(63, 63), [[5, "img", 9, 10],
                                                                    [5, 9, 10, 11]])
    hf = hf_vl_processor()(images=list(imgs), return_tensors="pt")
    ref = []
    for r in range(2):
        ids = torch.tensor(tokens[r:r + 1, :lengths[r]])
        mm = (ids == cfg.image_token_id).long()
        kw = dict(pixel_values=hf["pixel_values"], image_grid_thw=hf["image_grid_thw"],
                  mm_token_type_ids=mm) if r == 0 else {}
        with torch.no_grad():
            ref.append(model.generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                                      max_new_tokens=8, do_sample=False, eos_token_id=None,
                                      pad_token_id=0, **kw)[0, lengths[r]:].numpy())
    pos, deltas = rope_index(tokens, lengths, cfg, grid, 1)
    out = vl_generate(params, cfg, GenerateSpec(max_new_tokens=8, pad_id=0),
                      jnp.asarray(tokens), jnp.asarray(lengths), pixels, grid, jnp.asarray(pos),
                      jnp.asarray(deltas), key=jax.random.PRNGKey(0))
    np.testing.assert_array_equal(np.asarray(out.tokens), np.stack(ref))
    assert len(set(ref[1].tolist())) > 2
    tensors[stacked[0]] = tensors[stacked[0]][:, :, :-2]
    save_file(tensors, released / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(WeightsError, match=f"1 mis-shaped: .'{stacked[0]}"):
        load_vl_params(released)


def test_greedy_decode_with_images_equals_hf_generate(tmp_path):
    """Greedy tokens after prompts with images (two rows of different lengths, one and two
    Craftax frames) equal HF `generate`'s row by row, and each generated token's last-layer
    state equals our prompt pass over prompt + generated tokens."""
    import jax
    import torch

    from llm_jax.decode import GenerateSpec
    from llm_jax.mrope import rope_index
    from llm_jax.vision import preprocess
    from llm_jax.vl_loader import load_vl_params
    from llm_jax.vl_model import vl_generate, vl_hidden_states

    model = build_tiny_qwen3_vl(tmp_path / "vl", seed=3)
    cfg, params = load_vl_params(tmp_path / "vl")
    imgs = classic_frames(3)
    pixels, grid = preprocess(jnp.asarray(imgs), cfg.processor)
    # rows of different lengths (right-padded here) and image counts, so different rope
    # deltas; HF generates each row alone
    tokens, lengths = _rows(cfg, cfg.processor.num_tokens(63, 63),
                            [[5, "img", 9, 10], [6, "img", 7, "img", 11, 12, 13]])
    ref = []
    for r, mine in enumerate([imgs[:1], imgs[1:]]):
        hf = hf_vl_processor()(images=list(mine), return_tensors="pt")
        ids = torch.tensor(tokens[r:r + 1, :lengths[r]])
        mm = (ids == cfg.image_token_id).long()
        with torch.no_grad():
            ref.append(model.generate(
                input_ids=ids, attention_mask=torch.ones_like(mm), mm_token_type_ids=mm,
                pixel_values=hf["pixel_values"], image_grid_thw=hf["image_grid_thw"],
                max_new_tokens=8, do_sample=False, eos_token_id=None,
                pad_token_id=0)[0, lengths[r]:].numpy())
    ref = np.stack(ref)
    pos, deltas = rope_index(tokens, lengths, cfg, grid, 3)
    assert deltas[0] != deltas[1] and lengths[0] != lengths[1]
    spec = GenerateSpec(max_new_tokens=8, pad_id=0, hidden_layer=cfg.text.num_layers)
    out = vl_generate(params, cfg, spec, jnp.asarray(tokens), jnp.asarray(lengths), pixels,
                      grid, jnp.asarray(pos), jnp.asarray(deltas), key=jax.random.PRNGKey(0))
    np.testing.assert_array_equal(np.asarray(out.tokens), ref)
    assert len(set(ref.ravel().tolist())) > 2  # not one token repeated
    # the states of generated tokens: our prompt pass over prompt + generated equals them
    full = np.zeros((2, lengths.max() + 8), np.int64)
    for r in range(2):
        full[r, :lengths[r] + 8] = np.concatenate([tokens[r, :lengths[r]], ref[r]])
    pos2, _ = rope_index(full, lengths + 8, cfg, grid, 3)
    x = np.asarray(vl_hidden_states(params, cfg, jnp.asarray(full), jnp.asarray(lengths + 8),
                                    cfg.text.num_layers, pixels, grid, jnp.asarray(pos2)).x)
    # token i's state is taken when it is fed: positions len .. len + 7
    for r in range(2):
        np.testing.assert_allclose(np.asarray(out.hidden)[r], x[r, lengths[r]:lengths[r] + 8],
                                   atol=1e-4, rtol=0)


@pytest.mark.slow
def test_cli_encode_and_generate_with_images(tmp_path):
    """`python -m llm_jax encode --image A --image B --pool every:8` equals HF's hidden states
    (the prompt's tokens as HF's Qwen3-VL processor expands them) pooled over every 8th image
    token; `generate --image` gives HF generate's greedy tokens; bad images: one line each."""
    import sys

    import torch
    from PIL import Image
    from transformers import AutoTokenizer

    from conftest import ROOT, subprocess_env
    from llm_jax.tokenizer import packaged_tokenizer_dir

    model = build_tiny_qwen3_vl(tmp_path / "vl", vocab=151_680, seed=5)
    frames = classic_frames(4)[[0, 3]]
    paths = []
    for i, f in enumerate(frames):
        paths.append(str(tmp_path / f"f{i}.png"))
        Image.fromarray(f).save(paths[-1])
    text = "What is in front of the player?"

    def cli(*args, ok=True):
        p = run_command([sys.executable, "-m", "llm_jax", *args], cwd=ROOT,
                        env=subprocess_env(), capture_output=True, text=True, timeout=600)
        assert (p.returncode == 0) == ok, p.stderr[-3000:]
        return p

    images = [a for p in paths for a in ("--image", p)]
    cli("encode", "--weights", str(tmp_path / "vl"), *images, "--text", text, "--layer", "2",
        "--pool", "every:8", "--out", str(tmp_path / "e.npz"))
    got = np.load(tmp_path / "e.npz")
    hf_tok = AutoTokenizer.from_pretrained(packaged_tokenizer_dir())

    def proc(prompt, imgs):
        """HF's Qwen3-VL processor (processing_qwen3_vl.py, whose class needs torchvision for
        its video half): each <|image_pad|> replaced by grid / merge^2 of them, tokenized."""
        pix = hf_vl_processor()(images=imgs, return_tensors="pt")
        n = int(pix["image_grid_thw"][0].prod()) // 4
        ids = hf_tok(prompt.replace("<|image_pad|>", "<|image_pad|>" * n),
                     return_tensors="pt")["input_ids"]
        return dict(input_ids=ids, attention_mask=torch.ones_like(ids),
                    mm_token_type_ids=(ids == 151655).long(), **pix)

    vision = "<|vision_start|><|image_pad|><|vision_end|>"
    ref_in = proc(vision * 2 + text, list(frames))
    np.testing.assert_array_equal(got["token_ids"], ref_in["input_ids"][0].numpy())
    with torch.no_grad():
        ref = model(**ref_in, output_hidden_states=True).hidden_states[2][0].numpy()
    img = ref_in["input_ids"][0].numpy() == 151655
    assert img.sum() == 2 * 64
    np.testing.assert_allclose(got["hidden"], ref[img][::8].mean(0), atol=1e-4, rtol=0)

    cli("generate", "--weights", str(tmp_path / "vl"), "--image", paths[1], "--prompt", text,
        "--raw", "--greedy", "--ignore-eos", "--max-new-tokens", "6", "--out",
        str(tmp_path / "g.json"))
    row = json.loads((tmp_path / "g.json").read_text())["results"][0]
    ref_in = proc(vision + text, [frames[1]])
    assert row["prompt_ids"] == ref_in["input_ids"][0].tolist()
    with torch.no_grad():
        ref = model.generate(**ref_in, max_new_tokens=6, do_sample=False, eos_token_id=None,
                             pad_token_id=0)[0, len(row["prompt_ids"]):].tolist()
    assert row["tokens"] == ref

    # bad images: one line each, before any weight is read (the CLI's SystemExit)
    from llm_jax.cli_images import read_images

    Image.fromarray(frames[0][:40]).save(tmp_path / "small.png")
    (tmp_path / "bad.png").write_bytes(b"not a png")
    for extra, msg in [((paths[0], str(tmp_path / "small.png")), "different sizes"),
                       ((str(tmp_path / "bad.png"),), "is not an image"),
                       ((str(tmp_path / "none.png"),), "not found")]:
        with pytest.raises(SystemExit, match=f"^error: .*{msg}"):
            read_images(extra)
    # transparency lands on white, as HF's convert_to_rgb does
    rgba = np.concatenate([frames[0], np.full((63, 63, 1), 0, np.uint8)], -1)
    Image.fromarray(rgba, "RGBA").save(tmp_path / "clear.png")
    assert (read_images((str(tmp_path / "clear.png"),)) == 255).all()


def test_resize_is_pillows_bicubic_in_both_pass_orders():
    """`resize_bicubic` equals Pillow's `Image.resize(..., BICUBIC)` exactly, up and down, on
    shapes either side of the line where Pillow 13 runs its vertical pass first (the height
    losing more than twice the width's pixels)."""
    from PIL import Image

    from llm_jax.vision import resize_bicubic

    rng = np.random.default_rng(3)
    for h, w, hh, ww in [(100, 100, 39, 70), (100, 100, 40, 70), (700, 300, 192, 64),
                         (300, 700, 64, 192), (60, 60, 30, 120), (60, 60, 120, 30),
                         (130, 110, 288, 256), (63, 63, 256, 256), (50, 90, 25, 30),
                         (117, 50, 167, 191)]:
        x = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
        ref = np.asarray(Image.fromarray(x).resize((ww, hh), Image.BICUBIC))
        np.testing.assert_array_equal(np.asarray(resize_bicubic(jnp.asarray(x)[None], hh, ww))[0],
                                      ref, err_msg=f"{(h, w)} -> {(hh, ww)}")


def hf_prompt(frame: np.ndarray):
    """HF's input ids and pixel inputs of a uint8 frame [H, W, 3] in the label prompt (HF's
    processor, the chat template with the image, then the instruction)."""
    from transformers import AutoTokenizer

    from fused.llm.vl import VL_INSTRUCTION
    from llm_jax.tokenizer import packaged_tokenizer_dir

    hf_tok = AutoTokenizer.from_pretrained(packaged_tokenizer_dir())
    text = VL_INSTRUCTION.format(game="Craftax Classic")
    prompt = hf_tok.apply_chat_template(
        [{"role": "user", "content": "<|vision_start|><|image_pad|><|vision_end|>" + text}],
        tokenize=False, add_generation_prompt=True, enable_thinking=False)
    pix = hf_vl_processor()(images=[frame], return_tensors="pt")
    n = int(pix["image_grid_thw"][0].prod()) // 4
    ids = hf_tok(prompt.replace("<|image_pad|>", "<|image_pad|>" * n),
                 return_tensors="pt")["input_ids"]
    return ids, pix


def hf_image_states(model, frame: np.ndarray, layer: int) -> np.ndarray:
    """HF's Qwen3-VL states after `layer` of the image tokens of a frame in the label prompt."""
    import torch

    ids, pix = hf_prompt(frame)
    with torch.no_grad():
        ref = model(input_ids=ids, attention_mask=torch.ones_like(ids),
                    mm_token_type_ids=(ids == 151655).long(), **pix,
                    output_hidden_states=True).hidden_states[layer][0].numpy()
    return ref[ids[0].numpy() == 151655]


def hf_imagined(model, frame: np.ndarray, layer: int, n_new: int, stop: list[int]):
    """HF `generate`'s greedy tokens after a frame's label prompt (stopping at `stop`), and
    each generated token's state after `layer` at its own position."""
    import torch

    ids, pix = hf_prompt(frame)
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                             mm_token_type_ids=(ids == 151655).long(), **pix,
                             max_new_tokens=n_new, do_sample=False, eos_token_id=stop,
                             pad_token_id=0)
        states = model(input_ids=out, attention_mask=torch.ones_like(out),
                       mm_token_type_ids=(out == 151655).long(), **pix,
                       output_hidden_states=True).hidden_states[layer]
    return out[0, ids.shape[1]:].numpy(), states[0, ids.shape[1]:].numpy()


@pytest.mark.slow
def test_frames_prompt_continues_its_prefix_cache_and_pools_as_hf(tmp_path):
    """With `prefix_cache` (off by default: slower on CPU), the frames' encoder computes the
    text before the image once per call and its rows continue it (each row computes only the
    prompt after it); the pooled states still equal
    HF's Qwen3-VL over the whole prompt: `mean` over every prompt token, the prefix's
    included, `last`, and every 8th image token, after layer 2 (of 3) and the last layer
    post-normed; imagination's greedy tokens after the prefix equal HF `generate`'s."""
    import torch

    from fused.llm.config import ImagineConfig, LLMConfig
    from fused.llm.vl import VLEncoder, VLImaginingEncoder

    model = build_tiny_qwen3_vl(tmp_path / "vl", vocab=151_680, seed=3, layers=3)
    frames = classic_frames(3)
    ids, pix = hf_prompt(frames[0])
    for pool, layer, post in (("mean", 2, False), ("last", 2, False), ("every:8", 2, False),
                              ("mean", 3, True)):
        enc = VLEncoder(LLMConfig(backend="jax", weights=str(tmp_path / "vl"), layer=layer,
                                  pool=pool, post_norm=post, dtype="float32"),
                        "Craftax-Classic-Pixels-v1", 2, prefix_cache=True)
        # the prefix: <|im_start|>, user, \n, <|vision_start|>
        assert enc.prefix_len == 4 and enc.row_tokens == ids.shape[1] - 4
        assert np.array_equal(enc.ids, ids[0].numpy())
        got = np.asarray(jax.jit(enc.fn)(enc.params, jnp.asarray(frames[:2].reshape(2, -1)
                                                                  / 255.0)))
        for r in range(2):
            ids, pix = hf_prompt(frames[r])
            with torch.no_grad():
                out = model(input_ids=ids, attention_mask=torch.ones_like(ids),
                            mm_token_type_ids=(ids == 151655).long(), **pix,
                            output_hidden_states=True).hidden_states
            x = (out[layer] if not post else model.model.language_model.norm(out[layer])
                 if layer < 3 else out[3])[0].numpy()
            want = {"mean": x.mean(0), "last": x[-1],
                    "every:8": x[ids[0].numpy() == 151655][::8].mean(0)}[pool]
            np.testing.assert_allclose(got[r], want, atol=1e-4, rtol=0, err_msg=pool)
    enc = VLImaginingEncoder(LLMConfig(backend="jax", weights=str(tmp_path / "vl"), layer=2,
                                       dtype="float32",
                                       imagine=ImagineConfig(tokens=4, greedy=True)),
                             "Craftax-Classic-Pixels-v1", 1, prefix_cache=True)
    stop = list(enc.stop_ids)
    new, states = hf_imagined(model, frames[2], 2, 4, stop)
    _, tokens, num = jax.jit(enc.imagine)(enc.params, jnp.asarray(frames[2:].reshape(1, -1)
                                                                 / 255.0),
                                          jax.random.split(jax.random.PRNGKey(0), 1))
    assert int(num[0]) == len(new) and list(np.asarray(tokens)[0, :len(new)]) == list(new)


def run(*args, ok=True):
    """A repository command (`train.py ...`, `label.py ...`) as a user runs it, from the
    repository's root; whether it succeeds checked (`ok`), its output given back."""
    import sys

    from conftest import ROOT, subprocess_env

    p = run_command([sys.executable, *args], cwd=ROOT, env=subprocess_env(),
                    capture_output=True, text=True, timeout=600)
    assert (p.returncode == 0) == ok, p.stdout[-1500:] + p.stderr[-3000:]
    return p


def vl_flags(weights) -> tuple[str, ...]:
    return ("--llm.backend", "jax", "--llm.weights", str(weights), "--llm.layer", "2",
            "--llm.pool", "image-mean")


@pytest.fixture(scope="module")
def vl_ppo(tmp_path_factory):
    """Once for the module (each step below compiles its own programs, ~25-40 CPU s each):
    `train.py cpu-pixels --llm.weights VL_DIR`, PPO whose fused loop reads each env's frame
    with a tiny Qwen3-VL (the MoE variant: the dense text pass is the labels'; every step:
    --llm.skip-n 1), and `label.py generate` from that run (4 envs x 8 steps, one shard of 32
    rows, episodes of 6 steps: whole episodes for the returns AWR trains on; the `behaviour`
    label set holds the states the policy acted on).
    test_ppo_on_frames_with_a_vl_model_acts_on_hf_states checks both; the two labelling tests
    label copies of the dataset (frames of that policy's play) with dense models of their own,
    instead of each generating a random-play dataset of its own (~16 CPU s each)."""
    from types import SimpleNamespace

    root = tmp_path_factory.mktemp("vl-ppo")
    model = build_tiny_qwen3_vl(root / "vl", vocab=151_680, seed=7, experts=4, top_k=2,
                                router_scale=4.0)
    run("train.py", "cpu-pixels", *vl_flags(root / "vl"), "--llm.skip-n", "1",
        "--total-timesteps", "128", "--env.num-envs", "4", "--ppo.num-steps", "16",
        "--ppo.update-epochs", "1", "--ppo.num-minibatches", "2", "--out-dir", str(root),
        "--run-name", "px")
    run("label.py", "generate", "--out", str(root / "data"), "--policy", str(root / "px"),
        "--env.name", "Craftax-Classic-Pixels-v1", "--env.reset-pool", "2", "--num-envs", "4",
        "--steps", "8", "--env.max-episode-steps", "6", "--block-steps", "8", "--shard-rows",
        "32")
    return SimpleNamespace(model=model, weights=root / "vl", run=root / "px",
                           data=root / "data")


def frames_dataset(vl_ppo, folder):
    """A copy of the module's dataset of frames (`vl_ppo`: 4 envs x 8 steps of the VL policy's
    play in episodes of 6 steps, one 32-row shard) for a test that writes label and returns sets into it."""
    import shutil

    shutil.copytree(vl_ppo.data, folder)
    return folder


@pytest.mark.slow
def test_label_py_labels_frames_with_a_vl_model_as_hf_computes(tmp_path, vl_ppo):
    """`label.py label --llm.weights VL_DIR` on a dataset of frames (a copy of `vl_ppo`'s,
    recorded by `label.py generate`): each labelled row's state equals HF's Qwen3-VL on that
    frame (the uint8 stored, HF's processor, the chat template with the image, then the
    instruction), after layer 2, every 8th image token mean-pooled; rows between calls carry
    the label before them; offline.py awr trains on the set, and offline.py eval plays that
    policy online (the VL model reading its frames, as built now checked against the set's
    card)."""
    import json

    from fused.data.store import Dataset

    model = build_tiny_qwen3_vl(tmp_path / "vl", vocab=151_680, seed=5)
    data = frames_dataset(vl_ppo, tmp_path / "data")
    run("label.py", "label", "--data", str(data), "--name", "vl", "--llm.weights",
        str(tmp_path / "vl"), "--llm.pool", "every:8", "--llm.layer", "2", "--llm.skip-n", "4",
        "--batch", "4")
    ds = Dataset(data)
    name = ds.shard_names()[0]
    lab = ds.read_labels("vl", name)
    cols = ds.read(name, ["frame", "t", "step"])
    fresh = (cols["t"] % 4 == 0) | (cols["step"] == 0)
    rows = np.flatnonzero(fresh)[:3]
    assert len(rows) == 3 and lab["hidden"].shape[1] == 48
    later = np.flatnonzero(~fresh)[0]  # carries the state of the labelled row before it
    assert lab["label_row"][later] == lab["label_row"][later - 1]
    for r in rows:
        ref = hf_image_states(model, cols["frame"][r].reshape(63, 63, 3), 2)
        np.testing.assert_allclose(lab["hidden"][lab["label_row"][r]].astype(np.float32),
                                   ref[::8].mean(0), rtol=2 ** -8, atol=1e-5)  # kept bf16
    card = json.loads((data / "card.json").read_text())["labels"]["vl"]
    assert card["pool"] == "every:8" and card["vision"]["image_tokens"] == 64
    run("label.py", "returns", "--data", str(data))
    run("offline.py", "awr", "smoke", "--data", str(data), "--labels", "vl", "--num-updates",
        "4", "--batch-size", "16", "--out-dir", str(tmp_path), "--run-name", "awr")
    metrics = [json.loads(x) for x in (tmp_path / "awr" / "metrics.jsonl").read_text().splitlines()]
    assert metrics and all(np.isfinite(m["loss/actor"]) for m in metrics)
    # the policy trained on the label set plays online, the VL model reading its frames
    run("offline.py", "eval", "--run", str(tmp_path / "awr"), "--episodes", "2", "--max-steps",
        "6")
    ev = json.loads((tmp_path / "awr" / "eval.json").read_text())
    assert ev["episodes"] == 2 and ev["length_mean"] == 6


@pytest.mark.slow
def test_ppo_on_frames_with_a_vl_model_acts_on_hf_states(vl_ppo):
    """train.py cpu-pixels --llm.weights VL_DIR (`vl_ppo`'s run): the fused loop reads each
    env's frame with the Qwen3-VL (here the MoE variant; every step: --llm.skip-n 1) and
    trains; `label.py generate` from the run (`vl_ppo`'s dataset) records the states the policy
    acted on, each equal to HF's Qwen3-VL on that row's frame (the mean of the image tokens
    after layer 2); offline.py eval plays it (the ablations zero / shuffle act on the states
    after encoding, whatever made them: tests/test_fused_llm.py) and `offline.py probe` reads
    it; a VL model on a symbolic env, with a garbage prompt, on the vllm backend or playing
    (play.py llm): one line each."""
    import json

    from fused.data.store import Dataset

    model, px = vl_ppo.model, vl_ppo.run
    metrics = [json.loads(x) for x in (px / "metrics.jsonl").read_text().splitlines()]
    assert metrics and all(np.isfinite(m["loss/total"]) for m in metrics if "loss/total" in m)
    last = metrics[-1]
    # every step encodes every env's frame: 4 envs x 16 steps x the prompt's tokens a step
    assert last["llm/calls"] == 16 and last["llm/tokens"] % (4 * 16) == 0, last
    ds = Dataset(vl_ppo.data)
    name = ds.shard_names()[0]
    frames = ds.read(name, ["frame"])["frame"]
    hidden = ds.read_labels("behaviour", name)["hidden"]
    assert hidden.shape == (32, 48) and len(frames) == 32
    for r in (0, 5, 30):
        ref = hf_image_states(model, frames[r].reshape(63, 63, 3), 2).mean(0)
        np.testing.assert_allclose(hidden[r].astype(np.float32), ref, rtol=2 ** -8,
                                   atol=1e-5)  # stored bf16
    run("offline.py", "eval", "--run", str(px), "--episodes", "2", "--max-steps", "6",
        "--video", "1", "--video-max-steps", "3")
    ev = json.loads((px / "eval.json").read_text())
    assert ev["length_mean"] == 6 and len(ev["videos"]) == 1  # (frames alone: no text twin)
    # the probe: edits rendered as frames, read by the VL model; no garbage-prompt variant
    run("offline.py", "probe", "--run", str(px), "--states", "3", "--warmup", "2",
        "--eval-episodes", "0")
    probe = json.loads((px / "probe.json").read_text())
    assert set(probe["edits"]["food_low"]) == {"real", "zero", "shuffle"}
    assert set(probe["ablations"]["zombie_adjacent"]) == {"zero", "shuffle", "counterfactual"}
    assert np.isfinite([v["kl"] for a in probe["ablations"].values() for v in a.values()]).all()
    for bad, says in ((("--env.name", "Craftax-Classic-Symbolic-v1"), "reads frames"),
                      (("--llm.hidden", "garbage-prompt"), "garbage-prompt"),
                      (("--llm.backend", "vllm"), "vLLM")):
        p = run("train.py", "cpu-pixels", *vl_flags(vl_ppo.weights), *bad, "--total-timesteps",
                "128", "--env.num-envs", "4", "--ppo.num-steps", "16", ok=False)
        assert says in p.stderr and p.stderr.count("\n") == 1, p.stderr
    p = run("play.py", "llm", "--llm.weights", str(vl_ppo.weights), "--env.name",
            "Craftax-Classic-Pixels-v1", "--out-dir", str(px.parent), ok=False)
    assert "not built yet" in p.stderr and p.stderr.count("\n") == 1, p.stderr


def test_vision_flops_equal_xlas_count_of_the_tower():
    """`llm_jax.vision.vision_flops` (the GPU check's MFU) against XLA's own count of the
    compiled tower (one block: XLA counts a loop's body once), which also counts the elementwise
    work our matmul count leaves out: within 10% below it, for 130 x 110 and 63 x 63 frames, with and
    without a DeepStack merger."""
    import dataclasses

    import jax
    import jax.numpy as jnp

    from llm_jax.vision import preprocess, vision_flops, vision_tower
    from llm_jax.vl_config import VLConfig
    from llm_jax.vl_loader import random_vl_params

    base = VLConfig.from_dict({
        "model_type": "qwen3_vl", "tie_word_embeddings": True,
        "text_config": {"hidden_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2,
                        "num_key_value_heads": 1, "head_dim": 8, "intermediate_size": 32,
                        "vocab_size": 64, "max_position_embeddings": 256,
                        "rope_parameters": {"rope_theta": 1e4, "mrope_section": [2, 1, 1]}},
        "vision_config": {"depth": 1, "hidden_size": 128, "intermediate_size": 512,
                          "num_heads": 4, "out_hidden_size": 16, "num_position_embeddings": 64,
                          "deepstack_visual_indexes": [0]}})
    for size, deep in (((130, 110), (0,)), ((63, 63), ())):
        v = dataclasses.replace(base.vision, deepstack_visual_indexes=deep)
        params = random_vl_params(dataclasses.replace(base, vision=v)).vision
        pixels, grid = preprocess(jnp.zeros((1, *size, 3), jnp.uint8), base.processor)
        cost = jax.jit(lambda p, x: vision_tower(p, v, x, grid)).lower(
            params, pixels).compile().cost_analysis()
        cost = cost[0] if isinstance(cost, list) else cost
        ratio = vision_flops(v, int(np.prod(grid))) / cost["flops"]
        assert 0.9 < ratio <= 1.0, (size, deep, ratio)


@pytest.mark.slow
def test_imagination_with_frames_is_hf_generation_states_pooled(tmp_path, vl_ppo):
    """`label.py label --llm.weights VL_DIR --imagine.tokens N` on frames (a copy of `vl_ppo`'s
    dataset): each labelled row's tokens equal HF `generate`'s greedy ones after that frame's
    prompt, its text the tokens' text, and its state the mean of every 2nd generated token's
    state after layer 2 as HF computes them; the same imagination runs in the fused PPO loop
    (its tokens counted)."""
    import json

    from fused.data.labelling import imagined_texts
    from fused.data.store import Dataset
    from llm_jax.tokenizer import load_tokenizer, stop_ids

    model = build_tiny_qwen3_vl(tmp_path / "vl", vocab=151_680, seed=11)
    data = frames_dataset(vl_ppo, tmp_path / "data")
    run("label.py", "label", "--data", str(data), "--name", "im", "--llm.weights",
        str(tmp_path / "vl"), "--llm.layer", "2", "--llm.skip-n", "4", "--batch", "2",
        "--imagine.tokens", "5", "--imagine.pool", "every:2", "--imagine.greedy",
        "--imagine.keep-text")
    ds = Dataset(data)
    entry = ds.card()["labels"]["im"]
    assert entry["pool"] == "imagine:every:2" and entry["imagine"]["tokens"] == 5
    name = ds.shard_names()[0]
    cols = ds.read(name, ["frame", "t", "step"])
    frames = cols["frame"]
    lab = ds.read_labels("im", name)
    texts = imagined_texts(lab)
    tok = load_tokenizer(tmp_path / "vl")
    stop = list(stop_ids(tmp_path / "vl", tok, 151_680, chat=True))
    # the rows episode by episode (each env's first 6 steps, then its second episode's 2):
    # steps 0 and 4 of each first episode imagined (skip 4) and the first step of each second
    # one, the rows after each carrying its label
    assert cols["t"].tolist() == list(range(6)) * 4 + [6, 7] * 4
    assert cols["step"].tolist() == list(range(6)) * 4 + [0, 1] * 4
    assert lab["label_row"].tolist() == [2 * e + i for e in range(4) for i in (0, 0, 0, 0, 1, 1)
                                         ] + [8, 8, 9, 9, 10, 10, 11, 11]
    for j, r in ((0, 0), (1, 4)):
        new, states = hf_imagined(model, frames[r].reshape(63, 63, 3), 2, 5, stop)
        assert lab["imagined_len"][j] == len(new) and len(new) >= 2
        assert list(lab["imagined"][j, :len(new)]) == list(new)
        assert texts[j] == tok.decode(new.tolist())
        want = states[::2].mean(0)
        np.testing.assert_allclose(lab["hidden"][j].astype(np.float32), want,
                                   rtol=2 ** -8, atol=1e-5)  # stored bf16
    # online: the fused loop imagines after each frame (skip 1: 4 envs x 16 steps a update)
    run("train.py", "cpu-pixels", "--llm.weights", str(tmp_path / "vl"), "--llm.layer", "2",
        "--llm.skip-n", "1", "--llm.imagine.tokens", "3", "--llm.imagine.greedy",
        "--total-timesteps", "64", "--env.num-envs", "4", "--ppo.num-steps", "16",
        "--ppo.update-epochs", "1", "--ppo.num-minibatches", "2", "--out-dir", str(tmp_path),
        "--run-name", "im")
    row = [json.loads(x) for x in (tmp_path / "im" / "metrics.jsonl").read_text().splitlines()
           if "llm/tokens" in x][-1]
    prompts = 4 * 16 * entry["prompt_tokens"]  # (the same prompt as the label set's)
    assert prompts < row["llm/tokens"] <= prompts + 4 * 16 * 3, row
