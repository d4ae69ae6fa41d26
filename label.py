"""Datasets and LLM label sets (`fused.commands.label`); installed as `craftax-label`.
`python label.py --help` lists its presets and flags."""

from fused.commands.label import main

if __name__ == "__main__":
    main()
