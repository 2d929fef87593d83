"""The five reusable steps of the fine-tuning pipeline."""
