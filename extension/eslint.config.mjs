// ESLint for the sidebar's TypeScript: the recommended rules of ESLint and typescript-eslint.
import js from '@eslint/js';
import tseslint from 'typescript-eslint';

export default tseslint.config(
  { ignores: ['lib/', 'node_modules/', '../ortlab/labextension/'] },
  js.configs.recommended,
  ...tseslint.configs.recommended,
  {
    files: ['src/**/*.{ts,tsx}'],
    rules: {
      '@typescript-eslint/no-namespace': 'off',
      eqeqeq: 'error',
      curly: ['error', 'multi-line'],
      'no-restricted-properties': [
        'error',
        { property: 'innerHTML', message: 'Render server data as text (React), never as HTML.' }
      ],
      'no-restricted-syntax': [
        'error',
        {
          selector: "JSXAttribute[name.name='dangerouslySetInnerHTML']",
          message: 'Render server data as text (React), never as HTML.'
        }
      ]
    }
  }
);
