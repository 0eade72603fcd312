"""Directory authorities: votes, tor's params rule, consensus formation, the voting
schedule, documents, propagation and the what-if solver. No HTTP here."""
