"""Judge Decoding (Bachmann et al., ICLR 2025) at the lab's scale: a linear head on the target's
hidden state says whether a draft token is *wrong* in context; OR-ed with standard verification
(lab/verify/lossy.py) it changes the output, so quality is measured. Labels (`labels`), probes and
the head's file (`probe`), checkable questions (`tasks`), a code sandbox, the quality sweep."""
