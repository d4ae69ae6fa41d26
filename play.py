"""An LLM plays Craftax (`fused.commands.play`); installed as `craftax-play`.
`python play.py llm --help` lists its flags."""

from fused.commands.play import main

if __name__ == "__main__":
    main()
