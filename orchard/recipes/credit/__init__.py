"""Credit assignment on failed rollouts: hindsight values per agent step (`proxies.py`, the optional LLM
`judge.py`), smoothed into step weights (`values.py`, the shipped settings in `credit.yaml`), assigned and
capped (`assign.py`), and the data side of `orchard train sft --credit-assignment` (`sft.py`)."""
