"""Money: prices per model, what an exchange cost (docs/spend.md)."""
