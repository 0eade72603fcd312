"""Directory authorities: votes, tor's params rule, consensus formation, the voting
schedule, documents, propagation, the what-if solver and the tally behind
``kistexp authorities status``. No HTTP here."""
