"""Target ``onnx``: torch.onnx per partition, run by ONNX Runtime."""
