"""What a person sees: matplotlib figures (`plots`), pandas tables (`tables`), ipywidgets panels (`widgets`)."""
