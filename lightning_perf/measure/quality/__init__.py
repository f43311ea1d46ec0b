"""Image quality: the metrics (PSNR, SSIM, L1, LPIPS) and the scoring of a validation's outputs."""
