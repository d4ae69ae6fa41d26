"""Offline RL, evaluation, studies and probes (`fused.commands.offline`); installed as `craftax-offline`.
`python offline.py --help` lists its presets and flags."""

from fused.commands.offline import main

if __name__ == "__main__":
    main()
