"""People play Craftax (`python play.py human`): the game behind a key map (`game`), every step
recorded durably into a label.py dataset (`recorder`), served as a local web page (`server`)."""
