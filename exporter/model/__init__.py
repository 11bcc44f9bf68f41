"""Model loading: specs, Hugging Face and zoo models, capture and its errors."""
