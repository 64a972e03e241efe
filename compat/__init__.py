"""Drop-in front ends that follow SciPy's and NumPy's conventions."""

__all__: list[str] = []
