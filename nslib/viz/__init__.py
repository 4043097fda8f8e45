"""Figures and tables: the one helper notebooks write through, and plots several draw."""
