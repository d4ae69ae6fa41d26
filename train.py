"""Online PPO on Craftax (`fused.commands.train`); installed as `craftax-train`.
`python train.py --help` lists its presets and flags."""

from fused.commands.train import main

if __name__ == "__main__":
    main()
